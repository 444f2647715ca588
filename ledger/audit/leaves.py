"""Per-leaf checks: envelope form, signer, and every index row the leaf implies.

:func:`check_batch` is a pure function of what it is given (the registry and fingerprints
known so far, a run of leaves, the stored index rows that point into that run), so the audit
runs it in its own process or in worker processes and gets the same findings either way.
For each leaf it checks

- ``canonical``: the stored bytes parse as an envelope and are its RFC 8785 form;
- ``canonical``: the envelope is of a kind the ledger appends (:data:`LOGGED_KINDS`);
- ``index`` (``log_entries.kind``): the stored kind is the envelope's;
- ``signature``: a key event was checked in log order by the main process (one that was not
  is outside the log's key sequence); anything else verifies under a key registered at an
  earlier leaf, not revoked at an earlier leaf, whose role may sign that kind;
- ``index``: the ``records``, ``cache_keys``, ``fingerprints``, ``replays`` and
  ``certificates`` rows that name the leaf are exactly those ingest would have written for
  it (``ledger.audit.derive``), column by column: a missing row, an extra one, a row pointing
  at a leaf of another kind or at no leaf at all, a cache key row naming another record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ledger.audit import derive
from ledger.audit.registry import KEY_EVENTS, KeyEntry, signer_finding
from ledger.audit.report import Finding
from ledger.audit.rows import (
    CacheKeyRow,
    CertificateRow,
    DisclosureRow,
    ErasureRow,
    FingerprintRow,
    HoldReleaseRow,
    HoldRow,
    LeafChunk,
    Micros,
    RecordRow,
    ReplayRow,
    as_time,
)
from ledger.audit.times import made_at_finding
from ledger.disclosures import digest_of
from ledger.disclosures import parse as parse_disclosure
from ledger.erasure import ERASURE_KIND, HOLD_KIND, RELEASE_KIND
from ledger.errors import LedgerError, VerificationError
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.inference_record import InferenceRecord, parse_record
from ledger.key_scope import pool_out_of_scope
from ledger.records import RECORD_KIND
from ledger.replay import VERDICT_KIND
from ledger.signing import Envelope, VerifyingKey

# Every kind of leaf the ledger appends to its log. A collector also signs heartbeats and
# replay outputs, but they are stored beside the log, never in it: such a leaf in the log was
# put there by someone other than the ledger, and a checkpoint signed over it vouches for it.
LOGGED_KINDS = frozenset(
    (
        *KEY_EVENTS,
        RECORD_KIND,
        FINGERPRINT_KIND,
        VERDICT_KIND,
        derive.CERTIFICATE_KIND,
        ERASURE_KIND,
        HOLD_KIND,
        RELEASE_KIND,
    )
)

# The streamed index tables, and the leaf kind whose rows each holds.
TABLES = {
    "records": RECORD_KIND,
    "cache_keys": RECORD_KIND,
    "disclosures": RECORD_KIND,
    "fingerprints": FINGERPRINT_KIND,
    "replays": VERDICT_KIND,
    "certificates": derive.CERTIFICATE_KIND,
    "erasures": ERASURE_KIND,
    "holds": HOLD_KIND,
    "hold_releases": RELEASE_KIND,
}
_TIME_COLUMNS = frozenset({"received_at", "registered_at", "created_at", "revoked_at"})


@dataclass(frozen=True)
class Known:
    """What the main process has built, in log order, when it hands out a batch."""

    keys: Mapping[str, KeyEntry]
    # fingerprint ID -> (the leaf that first logged it, the chat template digest it names)
    fingerprints: Mapping[str, tuple[int, str | None]]
    sequenced: frozenset[int]  # key-event leaves the main process checked and applied
    tolerance: Micros = 0  # the clock difference allowed between hosts


@dataclass(frozen=True)
class Batch:
    """A run of leaves and the stored rows of every streamed table whose ``log_index`` falls
    in the run's span (from the end of the previous run to the last leaf of this one)."""

    leaves: LeafChunk
    records: Sequence[RecordRow] = ()
    cache_keys: Sequence[CacheKeyRow] = ()
    fingerprints: Sequence[FingerprintRow] = ()
    replays: Sequence[ReplayRow] = ()
    certificates: Sequence[CertificateRow] = ()
    disclosures: Sequence[DisclosureRow] = ()
    erasures: Sequence[ErasureRow] = ()
    holds: Sequence[HoldRow] = ()
    hold_releases: Sequence[HoldReleaseRow] = ()

    def tables(self) -> dict[str, Sequence[Any]]:
        return {
            "records": self.records,
            "cache_keys": self.cache_keys,
            "fingerprints": self.fingerprints,
            "replays": self.replays,
            "certificates": self.certificates,
            "disclosures": self.disclosures,
            "erasures": self.erasures,
            "holds": self.holds,
            "hold_releases": self.hold_releases,
        }


@dataclass
class _Leaf:
    """The findings of one batch, with the stored rows not yet matched to a leaf."""

    known: Known
    stored: dict[str, dict[int, list[Any]]]
    found: list[Finding] = field(default_factory=list)
    verifiers: dict[str, VerifyingKey] = field(default_factory=dict)

    def find(
        self,
        check: str,
        message: str,
        idx: int | None,
        table: str | None = None,
        column: str | None = None,
    ) -> None:
        self.found.append(Finding(check, message, idx, table, column))

    def take(self, table: str, idx: int) -> list[Any]:
        return self.stored[table].pop(idx, [])


def check_batch(known: Known, batch: Batch) -> list[Finding]:
    """Every finding for the leaves of ``batch`` and the rows that point into it."""
    stored: dict[str, dict[int, list[Any]]] = {}
    for table, rows in batch.tables().items():
        by_index: dict[int, list[Any]] = {}
        for row in rows:
            by_index.setdefault(row.log_index, []).append(row)
        stored[table] = by_index
    st = _Leaf(known, stored)
    leaves = batch.leaves
    kinds = leaves.kinds
    for pos, idx in enumerate(leaves.indexes):
        data = leaves.envelopes[pos]
        try:
            env = Envelope.from_bytes(data)
        except (ValueError, LedgerError) as exc:
            message = exc.message if isinstance(exc, LedgerError) else str(exc)
            st.find("canonical", f"stored envelope is not a valid envelope: {message}", idx)
            _unexpected(st, idx, "whose envelope cannot be read")
            continue
        if env.canonical != data:
            st.find("canonical", "stored envelope bytes are not in canonical (RFC 8785) form", idx)
        if kinds is not None and kinds[pos] != env.kind:
            st.find(
                "index",
                f"log_entries.kind of leaf {idx} is {kinds[pos]!r}; its envelope is a {env.kind}",
                idx,
                "log_entries",
                "kind",
            )
        if env.kind not in LOGGED_KINDS:
            st.find(
                "canonical",
                f"a {env.kind} is never a leaf of this log (no route appends one): the leaf was "
                "added to the database, not logged",
                idx,
                "log_entries",
            )
        elif env.kind in KEY_EVENTS:
            if idx not in known.sequenced:
                st.find("signature", f"{env.kind} outside the log's key sequence", idx)
        else:
            finding = signer_finding(known.keys, env, idx, st.verifiers)
            if finding is not None:
                st.found.append(finding)
        at = leaves.time(pos)
        moved = made_at_finding(env.kind, env.body, idx, at, known.tolerance)
        if moved is not None:
            st.found.append(moved)
        _index_rows(st, env, idx, at)
    for table, by_index in stored.items():
        for idx, rows in by_index.items():
            for row in rows:
                st.find(
                    "index",
                    f"{table} row {_ident(row)} names leaf {idx}, which is not in the log",
                    idx,
                    table,
                    "log_index",
                )
    return st.found


def _index_rows(st: _Leaf, env: Envelope, idx: int, at: Micros | None) -> None:
    """Compare the rows that name leaf ``idx`` with the rows its envelope implies."""
    kind = env.kind
    try:
        if kind == RECORD_KIND:
            record = derive.record_row(env, idx, at)
            logged = st.known.fingerprints.get(record.fingerprint_id)
            if logged is None or logged[0] >= idx:
                st.find(
                    "index",
                    f"record {record.request_id!r} names fingerprint {record.fingerprint_id}, "
                    "which the log does not hold before it",
                    idx,
                    "records",
                    "fingerprint_id",
                )
            template = logged[1] if logged is not None and logged[0] < idx else None
            parsed = _disclosures(st, env, idx, record.request_id)
            keys = derive.cache_key_rows(parsed, idx, template)
            _compare_one(st, "records", record, st.take("records", idx), idx)
            _compare_cache_keys(st, keys, st.take("cache_keys", idx), idx, record.request_id)
        elif kind == FINGERPRINT_KIND:
            row = derive.fingerprint_row(env, idx, at)
            _compare_one(st, "fingerprints", row, st.take("fingerprints", idx), idx)
        elif kind == VERDICT_KIND:
            replay = derive.replay_row(env, idx, at)
            _verdict_scope(st, env, idx)
            _compare_one(st, "replays", replay, st.take("replays", idx), idx, env.body)
            _output_disclosure(st, env, idx)
        elif kind == derive.CERTIFICATE_KIND:
            cert = derive.certificate_row(env, idx, at)
            _compare_one(st, "certificates", cert, st.take("certificates", idx), idx)
        elif kind == ERASURE_KIND:
            _compare_one(
                st, "erasures", derive.erasure_row(env, idx, at), st.take("erasures", idx), idx
            )
        elif kind == HOLD_KIND:
            _compare_one(st, "holds", derive.hold_row(env, idx, at), st.take("holds", idx), idx)
        elif kind == RELEASE_KIND:
            release = derive.release_row(env, idx, at)
            _compare_one(st, "hold_releases", release, st.take("hold_releases", idx), idx)
    except (KeyError, TypeError, ValueError, LedgerError) as exc:
        message = exc.message if isinstance(exc, LedgerError) else f"{type(exc).__name__}: {exc}"
        st.find("canonical", f"not a valid {kind} body ({message}): no index row follows", idx)
        for table in TABLES:
            if TABLES[table] == kind:
                st.take(table, idx)
    _unexpected(st, idx, f"which holds a {kind}")


def _verdict_scope(st: _Leaf, env: Envelope, idx: int) -> None:
    """A verdict's pool is one its worker's key may sign for (ledger.key_scope): a worker
    registers only in its key's pools, so a verdict naming another pool was not made here."""
    entry = st.known.keys.get(str(env.body.get("worker_key_id")))
    if entry is None:
        return
    problem = pool_out_of_scope(entry.pools, env.body.get("pool"), "replay verdict")
    if problem is not None:
        st.find("signature", f"{problem} (worker key {entry.key_id})", idx)


def _disclosures(st: _Leaf, env: Envelope, idx: int, request_id: str) -> InferenceRecord:
    """Check the stored disclosures of record leaf ``idx`` (each opens one of its digests,
    under its own digest and request ID); return the record parsed with those that do (with
    none, if together they do not open). A v2 record whose digests are not all opened is left
    ``pending`` until the scan has seen every erasure event. A body that is not a valid
    record raises (the caller reports it)."""
    rows = st.take("disclosures", idx)
    good: list[str] = []
    for row in rows:
        try:
            d = parse_disclosure(row.disclosure)
        except VerificationError as exc:
            st.find(
                "content",
                f"a stored disclosure of record {request_id!r} is malformed ({exc.message}): "
                "the disclosures table was edited",
                idx,
                "disclosures",
                "disclosure",
            )
            continue
        if row.digest != d.digest or row.request_id != request_id:
            st.find(
                "content",
                f"disclosures row {row.digest} names record {row.request_id!r} at leaf {idx}, "
                f"but holds the disclosure {d.digest} of record {request_id!r}'s leaf "
                "under another key",
                idx,
                "disclosures",
                "digest" if row.digest != d.digest else "request_id",
            )
            continue
        good.append(row.disclosure)
    try:
        record = parse_record(env.body, good)
    except VerificationError as exc:
        st.find(
            "content",
            f"a stored disclosure of record {request_id!r} does not open its signed digests "
            f"({exc.message}): the disclosures table was edited",
            idx,
            "disclosures",
            "disclosure",
        )
        return parse_record(env.body)
    except LedgerError as exc:
        if not good:
            raise  # the body itself is not a valid record: the caller reports it
        record = parse_record(env.body)  # raises, and is reported, if the body is not valid
        st.find(
            "content",
            f"record {request_id!r} does not parse with the {len(good)} disclosure(s) stored "
            f"at its leaf ({exc.message}): the disclosures table was edited, or the content "
            "its collector signed is not valid",
            idx,
            "disclosures",
            "log_index",
        )
        return record
    if not record.complete:
        st.found.append(
            Finding(
                "content",
                f"record {request_id!r} lacks {len(record.missing_digests)} disclosure(s)",
                idx,
                "disclosures",
                request_id=request_id,
                pending=record.missing_digests,
            )
        )
    return record


def _output_disclosure(st: _Leaf, env: Envelope, idx: int) -> None:
    """A verdict that commits to its replay output (``output_digest``) has that one
    disclosure stored at its leaf, or an erasure event removed it (pending)."""
    rows = st.take("disclosures", idx)
    digest = env.body.get("output_digest")
    request_id = str(env.body.get("request_id"))
    if digest is None:
        for row in rows:
            st.find(
                "content",
                f"disclosures row {row.digest} names verdict leaf {idx}, which commits to none",
                idx,
                "disclosures",
                "log_index",
            )
        return
    held = [r for r in rows if r.digest == digest]
    for row in rows:
        if row.digest != digest or digest_of(row.disclosure) != digest:
            st.find(
                "content",
                f"disclosures row {row.digest} at verdict leaf {idx} does not open the "
                f"verdict's output digest {digest}",
                idx,
                "disclosures",
                "disclosure",
            )
        elif row.request_id != request_id:
            # an erasure finds a request's content by its ID: a row filed under another
            # would outlive the erasure of the record the verdict is about
            st.find(
                "content",
                f"disclosures row {row.digest} at verdict leaf {idx} names record "
                f"{row.request_id!r}, but the verdict is about {request_id!r}",
                idx,
                "disclosures",
                "request_id",
            )
    if not held:
        st.found.append(
            Finding(
                "content",
                f"replay verdict of {request_id!r} lacks its output disclosure",
                idx,
                "disclosures",
                "output_digest",
                request_id=request_id,
                pending=(str(digest),),
            )
        )


def _unexpected(st: _Leaf, idx: int, what: str) -> None:
    """Rows still held for leaf ``idx`` after its own were taken: they belong to no leaf."""
    for table, by_index in st.stored.items():
        for row in by_index.pop(idx, ()):
            st.find(
                "index",
                f"{table} row {_ident(row)} names leaf {idx}, {what}",
                idx,
                table,
                "log_index",
            )


def _ident(row: Any) -> str:
    return repr(row[0])


def _shown(column: str, value: Any) -> str:
    return as_time(value) if column in _TIME_COLUMNS else repr(value)


def _compare_one(
    st: _Leaf,
    table: str,
    want: NamedTuple,
    held: list[Any],
    idx: int,
    body: dict[str, Any] | None = None,
) -> None:
    if not held:
        st.find("index", f"{table} has no row for leaf {idx} ({_ident(want)})", idx, table)
        return
    got, *extra = held
    for row in extra:
        st.find("index", f"{table} holds a second row for leaf {idx}: {_ident(row)}", idx, table)
    for column, expected, stored in zip(want._fields, want, got, strict=True):
        if column == "extra":
            continue
        if stored != expected:
            st.find(
                "index",
                f"{table}.{column} of leaf {idx} is {_shown(column, stored)}; the log says "
                f"{_shown(column, expected)}",
                idx,
                table,
                column,
            )
    if body is not None and isinstance(got, ReplayRow):
        for column, stored in got.extra:
            if column in body and body[column] != stored:
                st.find(
                    "index",
                    f"{table}.{column} of leaf {idx} is {stored!r}; the log says {body[column]!r}",
                    idx,
                    table,
                    column,
                )


def _compare_cache_keys(
    st: _Leaf, want: list[CacheKeyRow], held: list[CacheKeyRow], idx: int, request_id: str
) -> None:
    expected = {row.cache_key: row for row in want}
    stored: dict[str, CacheKeyRow] = {}
    for row in held:
        if row.cache_key in stored or row.cache_key not in expected:
            st.find(
                "index",
                f"cache_keys row {row.cache_key} (request {row.request_id!r}) names leaf {idx}, "
                f"but is not a key of its record {request_id!r}",
                idx,
                "cache_keys",
                "cache_key",
            )
        else:
            stored[row.cache_key] = row
    for key, row in expected.items():
        got = stored.get(key)
        if got is None:
            st.find(
                "index",
                f"cache_keys has no row for key {key} of leaf {idx} (request {request_id!r})",
                idx,
                "cache_keys",
                "cache_key",
            )
            continue
        if got.request_id != row.request_id:
            st.find(
                "index",
                f"cache_keys row {key} of leaf {idx} is misdirected: it names request "
                f"{got.request_id!r}, the leaf's record is {row.request_id!r}",
                idx,
                "cache_keys",
                "request_id",
            )
        for column in ("tier", "deterministic"):
            stored_value, expected_value = getattr(got, column), getattr(row, column)
            if stored_value != expected_value:
                st.find(
                    "index",
                    f"cache_keys.{column} of key {key} (leaf {idx}) is {stored_value!r}; the "
                    f"log says {expected_value!r}",
                    idx,
                    "cache_keys",
                    column,
                )
