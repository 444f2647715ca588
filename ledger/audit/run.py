"""The audit's one pass over the log, and what it checks after it.

The audit trusts nothing it reads except the log key (pinned, or else the key that the log's
first leaf registers). It streams every leaf in index order, once, and

1. checks the sequence and leaf hashes and rebuilds the tree, comparing every stored node
   (``ledger.audit.rebuild``);
2. applies key events and notes fingerprints in log order, in this process
   (``ledger.audit.registry``); a leaf is sent this way when its bytes hold
   ``"kind":"key_re`` or ``"kind":"fingerprint"``, which every canonical key event and
   fingerprint does, so the decision depends only on the stored bytes;
3. checks every receive time against the checkpoints around it (``ledger.audit.times``;
   the checkpoints are verified once the log key is known, ``ledger.audit.checkpoints``);
4. hands the chunk, with the stored rows of every index table that point into it, to
   :func:`ledger.audit.leaves.check_batch` (here, or in a worker process: same findings);

then checks every checkpoint's root and consistency, the leaves no checkpoint covers, the
rows that point past the log, and the key registry tables. The result lists every finding,
sorted by leaf; the first bad leaf index is the lowest one named.

``signatures=False`` (``--structure-only``) does steps 1 and 3 and the checkpoint checks, and
needs the pinned log key.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from ledger.audit import content, derive, tables
from ledger.audit.checkpoints import Checkpoints
from ledger.audit.leaves import Batch, Known, check_batch
from ledger.audit.rebuild import Rebuild, planned
from ledger.audit.registry import KEY_EVENTS, KeyTimeline
from ledger.audit.report import AuditReport, Finding
from ledger.audit.rows import AuditReader, LeafChunk, Runs, Spans, micros
from ledger.audit.times import SECOND, TimeBounds, TimeRules
from ledger.errors import InvalidInput, LedgerError
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.signing import Envelope, VerifyingKey, key_id_of

Progress = Callable[[int, int], None]
_IN_LOG_ORDER = (b'"kind":"key_re', b'"kind":"fingerprint"', *content.MARKERS)
DEFAULT_CLOCK_TOLERANCE = 5.0  # seconds
DEFAULT_CHECKPOINT_INTERVAL = 1.0  # seconds: the server's default (LEDGER_CHECKPOINT_INTERVAL)


@dataclass(frozen=True)
class AuditOptions:
    pinned_log_key: bytes | None = None  # raw Ed25519 public key
    signatures: bool = True  # False: structure only
    trusted_checkpoints: tuple[str, ...] = ()  # signed notes seen earlier
    workers: int = 1  # processes checking envelopes
    chunk: int = 2000  # leaves per read and per batch
    parallel_from: int = 5000  # fewer leaves than this: one process (spawning costs more)
    clock_tolerance: float = DEFAULT_CLOCK_TOLERANCE  # seconds
    checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL  # seconds
    now: datetime | None = None  # "now" for uncovered leaves (default: when the scan began)


class _Stream:
    """An index table's rows in log_index order, taken a span at a time."""

    def __init__(self, table: str, source: Iterator[Sequence[Any]]) -> None:
        self.table = table
        self.source = source
        self.buffer: Sequence[Any] = ()
        self.pos = 0
        self.done = False
        self.found: list[Finding] = []  # rows whose log_index is no integer

    def _next(self) -> Sequence[Any]:
        rows = next(self.source)
        if all(type(row.log_index) is int for row in rows):
            return rows
        good, found = tables.leaf_indexes(self.table, rows)
        self.found += found
        return good

    def until(self, end: int) -> list[Any]:
        """The next rows whose log_index is below ``end``."""
        out: list[Any] = []
        while True:
            buffer, pos = self.buffer, self.pos
            start = pos
            while pos < len(buffer) and buffer[pos].log_index < end:
                pos += 1
            out.extend(buffer[start:pos])
            self.pos = pos
            if pos < len(buffer) or self.done:
                return out
            try:
                self.buffer, self.pos = self._next(), 0
            except StopIteration:
                self.buffer, self.pos, self.done = (), 0, True

    def rest(self) -> list[Any]:
        out = list(self.buffer[self.pos :])
        while not self.done:
            try:
                out.extend(self._next())
            except StopIteration:
                self.done = True
        self.buffer, self.pos = (), 0
        return out

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if close is not None:
            close()


def _close(source: object) -> None:
    close = getattr(source, "close", None)
    if close is not None:
        close()


class _Audit:
    def __init__(self, reader: AuditReader, options: AuditOptions, progress: Progress | None):
        self.reader, self.options, self.progress = reader, options, progress
        self.report = AuditReport(signatures=options.signatures)
        self.found: list[Finding] = self.report.findings
        self.timeline = KeyTimeline(options.pinned_log_key)
        if not options.signatures:
            self.timeline.seed_pinned()
        self.bounds: TimeBounds | None = None
        # fingerprint ID -> (the leaf that first logged it, its chat template digest)
        self.fingerprints: dict[str, tuple[int, str | None]] = {}
        self._known: tuple[Known | None, int, int] = (None, -1, -1)  # cached, and as of what
        self.streams: dict[str, _Stream] | None = None
        self.events = content.ContentEvents()

    def run(self) -> AuditReport:
        try:
            return self._run()
        finally:
            self._close_streams()

    def _close_streams(self) -> None:
        for stream in (self.streams or {}).values():
            stream.close()

    def _run(self) -> AuditReport:
        started = time.perf_counter()
        opts, reader = self.options, self.reader
        total = reader.log_size()
        for table, problem in reader.protections():
            self.found.append(Finding("database", problem, None, table))
        self.checkpoints = Checkpoints.read(reader.checkpoints(), opts.trusted_checkpoints)
        self.report.checkpoints = len(self.checkpoints.rows)
        self.rebuild = Rebuild(self.checkpoints.sizes, self.found)
        parallel = opts.signatures and opts.workers > 1 and total >= opts.parallel_from
        pool = (
            ProcessPoolExecutor(opts.workers, mp_context=multiprocessing.get_context("spawn"))
            if parallel
            else None
        )
        inflight: deque[Future[list[Finding]]] = deque()
        plan = planned(opts.chunk)
        # One scan in index order, in one read transaction; the reader may read it and the
        # stored nodes each chunk completes ahead of the checks.
        leaves = reader.leaves(opts.chunk, kinds=opts.signatures)
        nodes = reader.node_runs(planned(opts.chunk))
        try:
            for stored in leaves:
                spans_ahead, runs_ahead = next(plan), next(nodes)
                self.rebuild.add(stored)
                chunk = stored.integral()
                batch = self._in_log_order(chunk) if opts.signatures and chunk else None
                if self.bounds is None:
                    self._verify_checkpoints()
                assert self.bounds is not None
                if chunk:
                    self.found.extend(self.bounds.check(chunk))
                if batch is not None:
                    known, work = batch
                    if pool is None:
                        self.found.extend(check_batch(known, work))
                    else:
                        inflight.append(pool.submit(check_batch, known, work))
                        while len(inflight) > 2 * opts.workers:
                            self.found.extend(inflight.popleft().result())
                self.report.leaves += len(stored)
                self.rebuild.compare(spans_ahead, runs_ahead, self._read_runs, reader.node_levels)
                if self.progress is not None:
                    self.progress(self.report.leaves, total)
            while inflight:
                self.found.extend(inflight.popleft().result())
        finally:
            _close(leaves)  # ends read-ahead threads and their transactions now, not at GC
            _close(nodes)
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        if self.bounds is None:
            self._verify_checkpoints()
        assert self.bounds is not None
        end = self.rebuild.expected  # the scan's end: rows at or past it came later
        self.checkpoints.check_roots(end, self.rebuild.roots, reader.read_nodes)
        self.found.extend(self.checkpoints.found)
        self.found.extend(self.bounds.coverage())
        self.found.extend(tables.tree_shape(*self.reader.tree_shape()))  # no node beyond them
        if opts.signatures:
            self._tables(end)
            resolved = content.resolve(
                self.found,
                self.events,
                reader.content_left,
                reader.record_rows,
                reader.committed_digests,
            )
            self.found[:] = resolved
        self.report.seconds = time.perf_counter() - started
        self.found.sort(key=Finding.sort_key)
        return self.report

    def _read_runs(self, spans: Spans) -> Runs:
        runs = self.reader.node_runs([spans])
        try:
            return next(iter(runs))
        finally:
            _close(runs)

    def _verify_checkpoints(self) -> None:
        """Once the log key is known (after the first chunk): verify the checkpoints, and
        take the audit's "now", after the scan's snapshot began (every leaf it holds was
        appended before), unless the options fix it."""
        opts, cps = self.options, self.checkpoints
        cps.verify(self.timeline.log_key)
        rules = TimeRules(
            micros(opts.now or datetime.now(UTC)),
            round(opts.clock_tolerance * SECOND),
            round(opts.checkpoint_interval * SECOND),
        )
        self.bounds = TimeBounds(cps.timed(), cps.covered(), rules)

    def _in_log_order(self, chunk: LeafChunk) -> tuple[Known, Batch]:
        """Apply the chunk's key events and note its fingerprints, in log order; return what
        its leaves are checked against and the batch to check."""
        sequenced = []
        for pos, data in enumerate(chunk.envelopes):
            if not any(marker in data for marker in _IN_LOG_ORDER):
                continue
            idx = chunk.indexes[pos]
            try:
                env = Envelope.from_bytes(data)
            except (ValueError, LedgerError):
                continue  # the batch reports it
            if env.kind in KEY_EVENTS:
                self.found.extend(self.timeline.apply(env, idx, chunk.time(pos)))
                sequenced.append(idx)
            elif env.kind == FINGERPRINT_KIND:
                template = derive.chat_template(env.body)
                self.fingerprints.setdefault(env.body_digest, (idx, template))
            else:
                raw = self.timeline.log_key
                key = VerifyingKey(raw, key_id_of(raw)) if raw is not None else None
                self.events.note(env, idx, key)
        if self.streams is None:  # opened after the scan's first read: they see all it sees
            self.streams = self._open_streams()
        end = chunk.indexes[-1] + 1  # integers only (LeafChunk.integral)
        rows = {name: stream.until(end) for name, stream in self.streams.items()}
        return self._known_now(frozenset(sequenced)), Batch(chunk, **rows)

    def _known_now(self, sequenced: frozenset[int]) -> Known:
        """The registry and fingerprints as of now, copied only when they changed."""
        known, keys, fingerprints = self._known
        if known is None or (keys, fingerprints) != (self.timeline.events, len(self.fingerprints)):
            known = Known(
                self.timeline.snapshot(),
                dict(self.fingerprints),
                frozenset(),
                round(self.options.clock_tolerance * SECOND),
            )
            self._known = (known, self.timeline.events, len(self.fingerprints))
        return replace(known, sequenced=sequenced) if sequenced else known

    def _open_streams(self) -> dict[str, _Stream]:
        reader, chunk = self.reader, self.options.chunk
        return {
            "records": _Stream("records", reader.records(chunk)),
            "cache_keys": _Stream("cache_keys", reader.cache_keys(chunk)),
            "fingerprints": _Stream("fingerprints", reader.fingerprints(chunk)),
            "replays": _Stream("replays", reader.replays(chunk)),
            "certificates": _Stream("certificates", reader.certificates(chunk)),
            "disclosures": _Stream("disclosures", reader.disclosures(chunk)),
            "erasures": _Stream("erasures", reader.erasures(chunk)),
            "holds": _Stream("holds", reader.holds(chunk)),
            "hold_releases": _Stream("hold_releases", reader.hold_releases(chunk)),
        }

    def _tables(self, end: int) -> None:
        """Rows past the scan, and the key registry tables."""
        if self.streams is None:
            self.streams = self._open_streams()
        size = self.reader.log_size()
        for name, stream in self.streams.items():
            rest = stream.rest()
            self.found.extend(stream.found)
            self.found.extend(tables.past_the_log(name, rest, end, size))
        self.found.extend(tables.signing_keys(self.timeline, self.reader.signing_keys(), end, size))
        self.found.extend(tables.revocations(self.timeline, self.reader.revocations(), end, size))


def run_audit(
    reader: AuditReader, options: AuditOptions | None = None, progress: Progress | None = None
) -> AuditReport:
    """Audit the whole log the reader holds (see the module docstring)."""
    options = options or AuditOptions()
    if not options.signatures and options.pinned_log_key is None:
        raise InvalidInput(
            "a structure-only audit needs the pinned log key", code="log_key_required"
        )
    if options.chunk < 1 or options.workers < 1:
        raise InvalidInput("chunk and workers must be at least 1", code="invalid_parameters")
    if options.clock_tolerance < 0 or options.checkpoint_interval < 0:
        raise InvalidInput(
            "the clock tolerance and checkpoint interval must be >= 0", code="invalid_parameters"
        )
    return _Audit(reader, options, progress).run()
