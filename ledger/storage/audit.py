"""``ledger audit``: recompute the log from the stored rows and check everything against it.

The audit trusts nothing it reads except the log key (pinned, or else the key that the log's
first leaf registers). It streams every leaf in index order and checks

- ``sequence``: indexes are contiguous from 0;
- ``leaf_hash``: the stored leaf hash is SHA-256(0x00 || stored envelope bytes);
- ``canonical``: the stored envelope bytes are the RFC 8785 form of the envelope;
- ``signature``: each envelope verifies under the key registry *as the log itself built it up
  to that leaf* (registrations and revocations are leaves signed by the log key), with a key
  whose role may sign that kind;
- ``checkpoint``: every stored checkpoint is signed by the log key, its row matches its note,
  its root equals the root rebuilt from the leaves, successive checkpoints are consistent
  (RFC 9162 proof from the stored nodes, verified), and the stored nodes give the same roots;
- ``index``: the records, fingerprints, keys, revocations and replays tables agree with the
  leaves.

It returns a report with every finding; the first bad leaf index is the lowest one named.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
import multiprocessing
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import func, select

from ledger import merkle
from ledger.checkpoint import Checkpoint, parse_checkpoint, verify_checkpoint
from ledger.errors import InvalidInput, LedgerError
from ledger.fingerprint import FINGERPRINT_KIND, fingerprint_id
from ledger.records import RECORD_KIND
from ledger.replay import VERDICT_KIND
from ledger.signing import (
    SIGNABLE_KINDS,
    Envelope,
    VerifyingKey,
    key_id_for,
    load_public_key,
    public_key_raw,
    verify_envelope,
)
from ledger.storage import log, tree
from ledger.storage.database import Database
from ledger.storage.keystore import LOG_ROLE, REGISTRATION_KIND, REVOCATION_KIND
from ledger.storage.models import (
    CheckpointRow,
    Fingerprint,
    KeyRevocation,
    LogEntry,
    Record,
    Replay,
    SigningKey,
)
from ledger.storage.prefetch import prefetched

Progress = Callable[[int, int], None]
CHUNK = 2000
PARALLEL_FROM = 5000  # below this many leaves, starting worker processes costs more than it saves


@dataclass(frozen=True)
class Finding:
    check: str
    message: str
    index: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "index": self.index, "message": self.message}


@dataclass
class AuditReport:
    leaves: int = 0
    checkpoints: int = 0
    signatures: bool = True
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def first_bad_index(self) -> int | None:
        indexes = [f.index for f in self.findings if f.index is not None]
        return min(indexes) if indexes else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "leaves": self.leaves,
            "checkpoints": self.checkpoints,
            "signatures_checked": self.signatures,
            "seconds": round(self.seconds, 3),
            "first_bad_index": self.first_bad_index,
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass
class _Key:
    public_key: Ed25519PublicKey
    role: str
    name: str
    registered_at: int
    raw: str
    revoked_at: int | None = None


@dataclass
class _State:
    pinned: Ed25519PublicKey | None
    report: AuditReport
    signatures: bool = True
    keys: dict[str, _Key] = field(default_factory=dict)
    log_key_id: str | None = None
    records: dict[str, tuple[int, str, str, str]] = field(default_factory=dict)
    fingerprints: dict[str, tuple[int, str]] = field(default_factory=dict)
    revocations: dict[str, int] = field(default_factory=dict)
    replays: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    # the rebuilt tree's right edge: level -> hash of its complete node at that level
    frontier: dict[int, bytes] = field(default_factory=dict)
    size: int = 0  # leaves pushed so far
    # nodes rebuilt but not yet compared with the stored ones: level -> (first index, hashes)
    pending: dict[int, tuple[int, list[bytes]]] = field(default_factory=dict)
    bad_nodes: set[merkle.Node] = field(default_factory=set)
    roots: dict[int, bytes] = field(default_factory=dict)

    def find(self, check: str, message: str, index: int | None = None) -> None:
        self.report.findings.append(Finding(check, message, index))


def _extend(st: _State, leaves: list[bytes]) -> None:
    """Append leaf hashes to the rebuilt tree, level by level; every node they complete is
    queued for comparison (the nodes a stretch of leaves completes are contiguous runs)."""
    frontier, pending, sha256, prefix = st.frontier, st.pending, hashlib.sha256, merkle.NODE_PREFIX
    level, start, items = 0, st.size, leaves
    while items:
        run = pending.get(level)
        if run is None:
            pending[level] = (start, list(items))
        else:
            run[1].extend(items)
        if start & 1:  # the left sibling is the complete node on the old right edge
            items = [frontier[level], *items]
            start -= 1
        pairs = zip(items[::2], items[1::2], strict=False)  # an odd last node stays on the edge
        items = [sha256(prefix + a + b).digest() for a, b in pairs]
        level += 1
        start >>= 1
    st.size = size = st.size + len(leaves)
    # The new right edge: one complete node per set bit of the size, rebuilt just now or,
    # when not, the same node the old edge held.
    edge: dict[int, bytes] = {}
    for level in range(size.bit_length()):
        if size >> level & 1:
            index = (size >> level) - 1
            run = pending.get(level)
            if run is not None and run[0] <= index < run[0] + len(run[1]):
                edge[level] = run[1][index - run[0]]
            else:
                edge[level] = frontier[level]
    st.frontier = edge


Spans = dict[int, tuple[int, int]]  # level -> (first, last) node index, inclusive
Runs = dict[int, tuple[int, bytes]]  # level -> (nodes stored, their hashes concatenated)


def _completed(start: int, end: int) -> Spans:
    """The nodes that leaves ``start`` .. ``end - 1`` complete, appended to a tree of ``start``
    leaves: at each level, from the node holding leaf ``start`` to the last one ending by
    ``end``."""
    spans: Spans = {}
    level = 0
    while (end >> level) - 1 >= start >> level:
        spans[level] = (start >> level, (end >> level) - 1)
        level += 1
    return spans


def _nodes_ahead(db: Database) -> Iterator[tuple[Spans, Runs]]:
    """For chunk 0, 1, 2, ... of the scan: the stored nodes its leaves complete if they are
    leaves ``k * CHUNK`` onwards (what the checks compare against; read ahead of them)."""
    start = 0
    while True:
        spans = _completed(start, start + CHUNK)
        with db.read() as s:
            runs = tree.read_runs(s, spans)
        yield spans, runs
        start += CHUNK


def _check_nodes(db: Database, st: _State, spans_ahead: Spans, runs_ahead: Runs) -> None:
    """Compare the rebuilt nodes with the stored ones (proofs are served from those): one
    read for the chunk (done ahead when the chunk was where it was expected), one comparison
    per level, node by node only where a level differs."""
    if not st.pending:
        return
    spans = {level: (first, first + len(run) - 1) for level, (first, run) in st.pending.items()}
    if spans == spans_ahead:
        runs = runs_ahead
    else:
        with db.read() as s:
            runs = tree.read_runs(s, spans)
    if all(
        runs.get(level) == (len(hashes), b"".join(hashes))
        for level, (_, hashes) in st.pending.items()
    ):
        st.pending.clear()
        return
    with db.read() as s:
        stored = tree.read_levels(s, spans)
    held = {(level, idx): h for level, rows in stored.items() for idx, h in rows}
    for level in sorted(st.pending):
        first, hashes = st.pending[level]
        for index, h in enumerate(hashes, first):
            node = (level, index)
            if level and (
                (level - 1, 2 * index) in st.bad_nodes or (level - 1, 2 * index + 1) in st.bad_nodes
            ):
                st.bad_nodes.add(node)  # already reported below it
                continue
            got = held.get(node)
            if got != h:
                st.bad_nodes.add(node)
                what = (
                    "is missing" if got is None else "differs from the node rebuilt from the leaves"
                )
                st.find("tree", f"stored Merkle node {node} {what}", index << level)
    st.pending.clear()


def _frontier_root(frontier: dict[int, bytes]) -> bytes:
    if not frontier:
        return merkle.EMPTY_ROOT
    levels = sorted(frontier)
    acc = frontier[levels[0]]
    for level in levels[1:]:
        acc = merkle.node_hash(frontier[level], acc)
    return acc


def _check_signer(st: _State, env: Envelope, idx: int) -> bool:
    """True when the envelope verifies under the registry as of its leaf; else a finding."""
    if env.kind in (REGISTRATION_KIND, REVOCATION_KIND):
        if st.log_key_id is None:  # the first leaf registers the log key itself
            if env.kind != REGISTRATION_KIND or env.body.get("role") != LOG_ROLE:
                st.find("signature", "the log does not start with the log key's registration", idx)
                return False
            anchor = load_public_key(str(env.body.get("public_key")))
            if st.pinned is not None and key_id_for(st.pinned) != key_id_for(anchor):
                st.find("signature", "the log's key is not the pinned log key", idx)
            st.log_key_id = key_id_for(st.pinned or anchor)
            st.keys[st.log_key_id] = _Key(st.pinned or anchor, LOG_ROLE, "ledger", idx, "")
        if env.key_id != st.log_key_id:
            st.find("signature", f"{env.kind} is not signed by the log key", idx)
            return False
        verify_envelope(env, st.keys[st.log_key_id].public_key)
        return True
    signer = st.keys.get(env.key_id)
    if signer is None:
        st.find("signature", f"signed by {env.key_id}, which the log never registered", idx)
        return False
    if signer.revoked_at is not None:
        st.find("signature", f"signed by {env.key_id}, revoked at leaf {signer.revoked_at}", idx)
        return False
    if env.kind not in SIGNABLE_KINDS.get(signer.role, ()):
        st.find("signature", f"a {signer.role} key may not sign {env.kind}", idx)
        return False
    verify_envelope(env, signer.public_key)
    return True


def _apply(st: _State, env: Envelope, idx: int) -> None:
    """Update the registry and the expected index tables from a verified leaf."""
    body = env.body
    if env.kind == REGISTRATION_KIND:
        key_id = str(body.get("key_id"))
        pub = load_public_key(str(body.get("public_key")))
        if key_id_for(pub) != key_id:
            st.find("signature", f"registration of {key_id} carries another key", idx)
            return
        st.keys[key_id] = _Key(
            pub, str(body.get("role")), str(body.get("name")), idx, str(body["public_key"])
        )
    elif env.kind == REVOCATION_KIND:
        key_id = str(body.get("key_id"))
        if key_id in st.keys:
            st.keys[key_id].revoked_at = idx
        st.revocations[key_id] = idx
    elif env.kind == RECORD_KIND:
        st.records[str(body.get("request_id"))] = (
            idx,
            env.body_digest,
            str(body.get("fingerprint_id")),
            env.key_id,
        )
    elif env.kind == FINGERPRINT_KIND:
        st.fingerprints[fingerprint_id(body)] = (idx, env.key_id)
    elif env.kind == VERDICT_KIND:
        st.replays[str(body.get("replay_id"))] = _verdict_row(idx, body)


def _verdict_row(idx: int, body: dict[str, Any]) -> tuple[int, str, str]:
    return (idx, str(body.get("verdict")), str(body.get("request_id")))


_LEAF_DIFFERS = "stored leaf hash differs from the hash of the stored envelope"


def _leaves(st: _State, rows: Sequence[log.Entry], wanted: list[int], expected: int) -> None:
    """Leaf hashes of a run of rows whose indexes are ``expected``, ``expected + 1``, ...:
    compared in one piece, added to the tree in stretches that end at checkpoint sizes."""
    sha256, prefix = hashlib.sha256, merkle.LEAF_PREFIX
    leaves = [sha256(prefix + data).digest() for _, _, data in rows]
    if b"".join(leaves) != b"".join(stored for _, stored, _ in rows):
        for (idx, stored, _), leaf in zip(rows, leaves, strict=True):
            if leaf != stored:
                st.find("leaf_hash", _LEAF_DIFFERS, idx)
    done = 0
    at = bisect.bisect_right(wanted, expected)
    while at < len(wanted) and wanted[at] <= expected + len(leaves):
        cut = wanted[at] - expected
        _extend(st, leaves[done:cut])
        st.roots[wanted[at]] = _frontier_root(st.frontier)
        done, at = cut, at + 1
    _extend(st, leaves[done:])


def _out_of_sequence(st: _State, rows: Sequence[log.Entry], wanted: set[int], expected: int) -> int:
    """Leaf by leaf, for rows whose indexes skip: each gap is a finding, and the tree is
    rebuilt from the rows as they are. Returns the next expected index."""
    for idx, stored, data in rows:
        if idx != expected:
            st.find("sequence", f"expected leaf {expected}, found leaf {idx}", expected)
            expected = idx
        leaf = merkle.leaf_hash(data)
        _extend(st, [leaf])
        if leaf != stored:
            st.find("leaf_hash", _LEAF_DIFFERS, idx)
        expected += 1
        if expected in wanted:
            st.roots[expected] = _frontier_root(st.frontier)
    return expected


def _envelope(st: _State, idx: int, data: bytes) -> None:
    """Canonical form, signer and registry update for one leaf, in log order."""
    try:
        env = Envelope.from_dict(json.loads(data))
    except (ValueError, LedgerError) as exc:
        st.find("canonical", f"stored envelope is not a valid envelope: {exc}", idx)
        return
    if env.canonical != data:
        st.find("canonical", "stored envelope bytes are not in canonical (RFC 8785) form", idx)
    try:
        signed = _check_signer(st, env, idx)
    except LedgerError as exc:
        st.find("signature", exc.message, idx)
        signed = False
    # A key event changes the registry only when the log key signed it; records and
    # fingerprints are indexed either way (their signature finding stands on its own).
    if not signed and env.kind in (REGISTRATION_KIND, REVOCATION_KIND):
        return
    try:
        _apply(st, env, idx)
    except LedgerError as exc:
        st.find("signature", f"{env.kind}: {exc.message}", idx)


# Key events (registrations, revocations) change the registry, so they are checked in log
# order by the main process; every other leaf only reads the registry "as of its index",
# which a timeline (registered at, revoked at) answers, so those are checked in parallel.
_KEY_EVENT = b'"kind":"key_re'
Timeline = dict[str, tuple[bytes, str, int, int | None]]  # key_id -> (raw, role, reg, rev)
Checked = tuple[
    list[tuple[str, str, int]],  # findings
    list[tuple[str, tuple[int, str, str, str]]],  # records
    list[tuple[str, tuple[int, str]]],  # fingerprints
    list[tuple[str, tuple[int, str, str]]],  # replay verdicts
]


def _timeline(st: _State) -> Timeline:
    return {
        key_id: (public_key_raw(k.public_key), k.role, k.registered_at, k.revoked_at)
        for key_id, k in st.keys.items()
    }


def check_rows(timeline: Timeline, rows: list[tuple[int, bytes]]) -> Checked:
    """Check leaves that are not key events against the registry timeline (a pure function,
    run in worker processes)."""
    findings: list[tuple[str, str, int]] = []
    records: list[tuple[str, tuple[int, str, str, str]]] = []
    fps: list[tuple[str, tuple[int, str]]] = []
    replays: list[tuple[str, tuple[int, str, str]]] = []
    keys: dict[str, VerifyingKey] = {}
    for idx, data in rows:
        try:
            env = Envelope.from_dict(json.loads(data))
        except (ValueError, LedgerError) as exc:
            findings.append(("canonical", f"stored envelope is not a valid envelope: {exc}", idx))
            continue
        if env.canonical != data:
            findings.append(
                ("canonical", "stored envelope bytes are not in canonical (RFC 8785) form", idx)
            )
        body = env.body
        if env.kind == RECORD_KIND:
            records.append(
                (
                    str(body.get("request_id")),
                    (idx, env.body_digest, str(body.get("fingerprint_id")), env.key_id),
                )
            )
        elif env.kind == FINGERPRINT_KIND:
            fps.append((fingerprint_id(body), (idx, env.key_id)))
        elif env.kind == VERDICT_KIND:
            replays.append((str(body.get("replay_id")), _verdict_row(idx, body)))
        elif env.kind in (REGISTRATION_KIND, REVOCATION_KIND):
            findings.append(("signature", f"{env.kind} outside the log's key sequence", idx))
            continue
        entry = timeline.get(env.key_id)
        if entry is None or entry[2] >= idx:
            findings.append(
                ("signature", f"signed by {env.key_id}, which the log never registered", idx)
            )
            continue
        raw, role, _, revoked = entry
        if revoked is not None and revoked < idx:
            findings.append(
                ("signature", f"signed by {env.key_id}, revoked at leaf {revoked}", idx)
            )
            continue
        if env.kind not in SIGNABLE_KINDS.get(role, ()):
            findings.append(("signature", f"a {role} key may not sign {env.kind}", idx))
            continue
        if env.key_id not in keys:
            keys[env.key_id] = VerifyingKey.of(Ed25519PublicKey.from_public_bytes(raw))
        try:
            verify_envelope(env, keys[env.key_id])
        except LedgerError as exc:
            findings.append(("signature", exc.message, idx))
    return findings, records, fps, replays


def _merge(st: _State, checked: Checked) -> None:
    findings, records, fps, replays = checked
    for check, message, idx in findings:
        st.find(check, message, idx)
    st.records.update(records)
    st.fingerprints.update(fps)
    st.replays.update(replays)


def audit(
    db: Database,
    pinned_log_key: Ed25519PublicKey | None = None,
    progress: Progress | None = None,
    *,
    signatures: bool = True,
    trusted_checkpoints: Sequence[str] = (),
    workers: int = 1,
) -> AuditReport:
    """Audit the whole log. ``signatures=False`` checks structure only (sequence, leaf
    hashes, tree, checkpoints) and needs the pinned log key to verify the checkpoints.

    ``trusted_checkpoints`` are signed notes seen earlier (kept from evidence bundles, or by a
    witness): the log must still hold each one's tree. Without them, deleting the newest
    leaves together with their checkpoints cannot be told from a log that never had them.

    ``workers`` > 1 verifies envelope signatures in that many processes (same findings).
    """
    if not signatures and pinned_log_key is None:
        raise InvalidInput(
            "a structure-only audit needs the pinned log key", code="log_key_required"
        )
    started = time.perf_counter()
    report = AuditReport(signatures=signatures)
    st = _State(pinned_log_key, report, signatures)
    if not signatures and pinned_log_key is not None:
        st.log_key_id = key_id_for(pinned_log_key)
        st.keys[st.log_key_id] = _Key(pinned_log_key, LOG_ROLE, "ledger", 0, "")
    with db.read() as s:
        total = int(s.execute(select(func.count()).select_from(LogEntry)).scalar_one())
        cps = list(s.execute(select(CheckpointRow).order_by(CheckpointRow.tree_size)).scalars())
    trusted = _parse_trusted(st, trusted_checkpoints)
    wanted_sizes = {cp.tree_size for cp in cps} | {cp.tree_size for _, cp in trusted}
    wanted = sorted(wanted_sizes)
    expected = 0
    parallel = signatures and workers > 1 and total >= PARALLEL_FROM
    pool = (
        ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        if parallel
        else None
    )
    inflight: deque[Future[Checked]] = deque()
    # One scan in index order, in one read transaction; the scan and the stored nodes are
    # each read ahead of the checks, in their own thread.
    nodes = prefetched(_nodes_ahead(db))
    scan = prefetched(log.scan(db, CHUNK))
    try:
        for rows in scan:
            spans_ahead, runs_ahead = next(nodes)
            batch: list[tuple[int, bytes]] = []
            if rows[0][0] == expected and rows[-1][0] == expected + len(rows) - 1:
                # indexes are unique and sorted: these are exactly the next ones
                _leaves(st, rows, wanted, expected)
                expected += len(rows)
            else:
                expected = _out_of_sequence(st, rows, wanted_sizes, expected)
            if signatures:
                for idx, _, data in rows:
                    if pool is None or _KEY_EVENT in data:
                        _envelope(st, idx, data)
                    else:
                        batch.append((idx, data))
            if pool is not None and batch:
                inflight.append(pool.submit(check_rows, _timeline(st), batch))
                while len(inflight) > 2 * workers:
                    _merge(st, inflight.popleft().result())
            report.leaves += len(rows)
            _check_nodes(db, st, spans_ahead, runs_ahead)
            if progress is not None:
                progress(report.leaves, total)
        while inflight:
            _merge(st, inflight.popleft().result())
    finally:
        scan.close()  # ends the read-ahead threads and their transactions now, not at GC
        nodes.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    _check_checkpoints(db, st, cps, expected)
    _check_trusted(st, trusted, expected)
    if signatures:
        _check_tables(db, st)
    report.seconds = time.perf_counter() - started
    report.findings.sort(key=lambda f: (f.index is None, f.index or 0, f.check, f.message))
    return report


def _parse_trusted(st: _State, notes: Sequence[str]) -> list[tuple[str, Checkpoint]]:
    out = []
    for note in notes:
        try:
            out.append((note, parse_checkpoint(note)[0]))
        except LedgerError as exc:
            st.find("trusted_checkpoint", f"cannot read a trusted checkpoint: {exc.message}")
    return out


def _check_trusted(st: _State, trusted: list[tuple[str, Checkpoint]], size: int) -> None:
    log_key = st.keys.get(st.log_key_id or "")
    for note, cp in trusted:
        where = f"trusted checkpoint of size {cp.tree_size}"
        if log_key is None:
            st.find("trusted_checkpoint", f"{where}: no log key to verify it with")
            continue
        try:
            verify_checkpoint(note, log_key.public_key)
        except LedgerError as exc:
            st.find("trusted_checkpoint", f"{where}: {exc.message}")
            continue
        if cp.tree_size > size:
            st.find(
                "trusted_checkpoint",
                f"{where}: the log holds only {size} leaves: leaves {size}..{cp.tree_size - 1} "
                "were removed (or the log was rolled back)",
                size,
            )
        elif st.roots.get(cp.tree_size) != cp.root_hash:
            st.find(
                "trusted_checkpoint",
                f"{where}: the log's leaves no longer give its root",
                cp.tree_size - 1,
            )


def _check_checkpoints(db: Database, st: _State, cps: list[CheckpointRow], size: int) -> None:
    st.report.checkpoints = len(cps)
    log_key = st.keys.get(st.log_key_id or "")
    previous: tuple[int, bytes] | None = None
    previous_time = None
    for row in cps:
        where = f"checkpoint of size {row.tree_size}"
        if log_key is None:
            st.find("checkpoint", f"{where}: no log key to verify it with")
            continue
        try:
            cp = verify_checkpoint(row.note, log_key.public_key)
        except LedgerError as exc:
            st.find("checkpoint", f"{where}: {exc.message}")
            continue
        if (cp.tree_size, cp.root_hash) != (row.tree_size, bytes(row.root_hash)):
            st.find(
                "checkpoint",
                f"{where}: the row does not match its signed note (note says size {cp.tree_size})",
            )
        if cp.tree_size > size:
            st.find("checkpoint", f"{where}: the log holds only {size} leaves")
            continue
        rebuilt = st.roots.get(cp.tree_size)
        if rebuilt != cp.root_hash:
            st.find(
                "checkpoint",
                f"{where}: signed root differs from the root rebuilt from the leaves",
                cp.tree_size - 1,
            )
        if previous_time is not None and row.signed_at < previous_time:
            st.find("checkpoint", f"{where}: signed before a smaller checkpoint")
        previous_time = row.signed_at
        try:
            with db.read() as s:
                if tree.root(s, cp.tree_size) != cp.root_hash:
                    st.find("checkpoint", f"{where}: stored Merkle nodes give another root")
                if previous is not None:
                    proof = merkle.consistency_proof(previous[0], cp.tree_size, tree.node_reader(s))
                    merkle.verify_consistency(
                        previous[0], cp.tree_size, previous[1], cp.root_hash, proof
                    )
        except LedgerError as exc:
            st.find("checkpoint", f"{where}: {exc.message}")
        previous = (cp.tree_size, cp.root_hash)


def _check_tables(db: Database, st: _State) -> None:
    """Index tables against the leaves. Rows for leaves past the scan (appended while the
    audit ran) are left out, so a live ledger raises no false alarm."""
    size = st.size
    with db.read() as s:
        records = {
            r.request_id: (r.log_index, r.content_hash, r.fingerprint_id, r.key_id)
            for r in s.execute(select(Record).where(Record.log_index < size)).scalars()
        }
        fps = {
            r.fingerprint_id: (r.log_index, r.key_id)
            for r in s.execute(select(Fingerprint).where(Fingerprint.log_index < size)).scalars()
        }
        keys = list(s.execute(select(SigningKey).where(SigningKey.log_index < size)).scalars())
        replays = {
            r.replay_id: (r.log_index, r.verdict, r.request_id)
            for r in s.execute(select(Replay).where(Replay.log_index < size)).scalars()
        }
        revs = {
            r.key_id: r.log_index
            for r in s.execute(
                select(KeyRevocation).where(KeyRevocation.log_index < size)
            ).scalars()
        }
    _compare(st, "records", records, st.records)
    _compare(st, "fingerprints", fps, st.fingerprints)
    _compare(st, "key_revocations", revs, st.revocations)
    _compare(st, "replays", replays, st.replays)
    seen = set()
    for row in keys:
        seen.add(row.key_id)
        want = st.keys.get(row.key_id)
        if want is None:
            st.find(
                "index",
                f"signing_keys holds {row.key_id}, which the log never registered",
                row.log_index,
            )
            continue
        try:
            held_id = key_id_for(load_public_key(_raw(row.public_key)))
        except LedgerError:
            held_id = None
        if held_id != row.key_id or (want.raw and want.raw != _raw(row.public_key)):
            st.find(
                "index",
                f"signing_keys row for {row.key_id} holds another public key than the log "
                "registered",
                row.log_index,
            )
        if (row.role, row.name, row.log_index) != (want.role, want.name, want.registered_at):
            st.find(
                "index",
                f"signing_keys row for {row.key_id} differs from its registration",
                row.log_index,
            )
    for key_id, k in st.keys.items():
        if key_id not in seen:
            st.find(
                "index",
                f"key {key_id} is registered in the log but missing from signing_keys",
                k.registered_at,
            )


def _raw(public_key: bytes) -> str:
    return "ed25519:" + base64.b64encode(bytes(public_key)).decode()


def _compare(st: _State, table: str, stored: dict[str, Any], logged: dict[str, Any]) -> None:
    for key, value in logged.items():
        held = stored.get(key)
        index = value[0] if isinstance(value, tuple) else value
        if held is None:
            st.find("index", f"{table}: {key} is in the log but has no row", index)
        elif held != value:
            st.find(
                "index", f"{table}: row for {key} differs from the log ({held} != {value})", index
            )
    for key, value in stored.items():
        if key not in logged:
            index = value[0] if isinstance(value, tuple) else value
            st.find("index", f"{table}: row {key} has no leaf in the log", index)
