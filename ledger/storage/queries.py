"""Reading records back: by request ID, and searched with cursor pagination.

The ``records`` table is an index: it finds log entries, it never states a fact. Every member
a read returns (request ID, model, pool, tier, worker, fingerprint, endpoint, aborted, signer,
content hash) is taken from the logged envelope the row points to, and the receive time from
that log entry. A search drops a row whose envelope does not satisfy the filters; a read by
request ID whose log entry does not hold that record raises ``IndexMismatch``. So an edited
index column can at most hide a record (``ledger audit`` reports the row), never misstate one.
The same holds for ``erasures``: a record is erased only by the erasure event its row points
to (``logged_erasure``), so a row pointing at any other leaf raises ``IndexMismatch``.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

import orjson
from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from ledger.canonical import canonicalize, sha256_digest
from ledger.clock import LOCAL_TIME, parse_rfc3339, rfc3339
from ledger.erasure import ERASURE_KIND
from ledger.errors import IndexMismatch, InvalidInput, LedgerError, NotFound
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.inference_record import InferenceRecord, parse_record
from ledger.lazy import lazy
from ledger.records import RECORD_KIND
from ledger.records import check_request_id as check_request_id  # routes check IDs here
from ledger.storage.database import Database, as_utc
from ledger.storage.models import Disclosure, Erasure, Fingerprint, LogEntry, Record

MAX_PAGE = 1000
# A page scans at most this many index rows beyond ``limit`` looking for rows to replace the
# ones it dropped; past it the page ends early and ``next_cursor`` continues the scan.
MAX_DROPPED = 1000
_CURSOR_VALUE = re.compile(r"0|[1-9][0-9]{0,18}")
EVENT_ID = re.compile(r"[A-Za-z0-9._:\-]{1,200}")  # replay and certificate IDs
FINGERPRINT_ID = re.compile(r"sha256:[0-9a-f]{64}")
NAME = re.compile(r"[A-Za-z0-9._\-]{1,100}")
MAX_MODEL = 300

logger = logging.getLogger("ledger.storage")


@dataclass(frozen=True)
class ErasureEvent:
    """A record's erasure event as its leaf logs it (built only by ``logged_erasure``)."""

    log_index: int
    envelope: bytes  # canonical envelope bytes, exactly as logged
    body: dict[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class StoredRecord:
    """A record as its log entry holds it: every member from the envelope, the time from the
    entry. Built only by ``from_log``."""

    request_id: str
    log_index: int
    content_hash: str
    fingerprint_id: str
    key_id: str
    model: str
    tier: int
    pool: str
    worker_id: str
    endpoint: str
    aborted: bool
    received_at: datetime
    envelope: bytes  # canonical envelope bytes, exactly as logged
    body: dict[str, Any] = field(repr=False, compare=False)  # the envelope's body, parsed
    # v2: the stored disclosures of this leaf (those not erased), read with the entry,
    # whether ``erasures`` holds the record and, read by ``with_content``, its erasure event.
    disclosures: tuple[str, ...] = field(default=(), repr=False, compare=False)
    erased: bool = field(default=False, compare=False)
    erasure: ErasureEvent | None = field(default=None, repr=False, compare=False)

    @lazy
    def record(self) -> InferenceRecord:
        """The typed record, its stored disclosures opened against the signed digests;
        IndexMismatch when the body is no record or a stored disclosure opens none."""
        try:
            return parse_record(self.body, self.disclosures)
        except LedgerError as exc:
            raise mismatch(
                f"record {self.request_id!r}", self.log_index, f"{exc.code}: {exc.message}"
            ) from None

    def with_disclosures(
        self,
        disclosures: Sequence[str],
        erased: bool = False,
        erasure: ErasureEvent | None = None,
    ) -> StoredRecord:
        return replace(
            self,
            disclosures=tuple(disclosures),
            erased=erased or erasure is not None,
            erasure=erasure,
        )

    def check_content(self) -> None:
        """IndexMismatch unless the stored content agrees with the erasure index: a v2
        record has all of its disclosures, or none and an erasure row. Anything else (a
        disclosure deleted without an erasure, content back after one) is an edited database."""
        record = self.record
        if not record.erasable:
            return
        if self.erased and self.disclosures:
            raise mismatch(
                f"record {self.request_id!r}", self.log_index, "content remains after its erasure"
            )
        if not self.erased and not record.complete:
            raise mismatch(
                f"record {self.request_id!r}",
                self.log_index,
                f"{len(record.missing_digests)} disclosure(s) missing without an erasure",
            )

    @property
    def content(self) -> str:
        """``complete``, ``erased`` (v2, disclosures deleted by an erasure) or, for a v1
        record whose content is its leaf's, ``in_log``."""
        if self.body.get("schema_version") == 1:
            return "in_log"
        return "erased" if self.erased else "complete"

    def meta(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "log_index": self.log_index,
            "content_hash": self.content_hash,
            "fingerprint_id": self.fingerprint_id,
            "key_id": self.key_id,
            "model": self.model,
            "tier": self.tier,
            "pool": self.pool,
            "worker_id": self.worker_id,
            "endpoint": self.endpoint,
            "aborted": self.aborted,
            "received_at": rfc3339(self.received_at),
            "schema_version": self.body.get("schema_version"),
            "content": self.content,
        }


def mismatch(what: str, log_index: int, problem: str, **details: Any) -> IndexMismatch:
    """The error for an index row that does not agree with its log entry (logged too)."""
    logger.warning("index mismatch: %s -> log entry %d: %s", what, log_index, problem)
    return IndexMismatch(
        f"the index row for {what} does not agree with log entry {log_index} ({problem}): "
        "the database was edited; run `ledger audit` to find every such row",
        details={"log_index": log_index, **details},
    )


def stored_bytes(value: object) -> bytes | None:
    """A byte column's value as bytes; None when SQLite hands back another type (the same
    bytes written back as text, say: only an edit stores one; the audit names it)."""
    if type(value) is bytes:
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return None


def logged_envelope(data: bytes, log_index: int, kind: str) -> tuple[dict[str, Any], bytes]:
    """Parse a logged envelope of ``kind``: (envelope, canonical body bytes).

    The body bytes are cut out of the logged bytes (JCS puts ``body`` first and nests its
    canonical form, as ``ledger.signing.Envelope`` assembles it), so the content hash costs one
    SHA-256 and no re-encoding. Raises IndexMismatch when the entry holds no such envelope."""
    try:
        env = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise mismatch(kind, log_index, "the entry is not JSON") from None
    if not isinstance(env, dict) or env.get("kind") != kind:
        got = env.get("kind") if isinstance(env, dict) else None
        raise mismatch(kind, log_index, f"the entry holds a {got!r} envelope")
    body, signature = env.get("body"), env.get("signature")
    if not isinstance(body, dict) or not isinstance(signature, dict) or len(env) != 3:
        raise mismatch(kind, log_index, "the entry is not a signed envelope")
    try:
        tail = b',"kind":' + canonicalize(kind) + b',"signature":' + canonicalize(signature) + b"}"
        if data.startswith(b'{"body":') and data.endswith(tail):
            return env, data[8 : len(data) - len(tail)]
        return env, canonicalize(body)
    except LedgerError:
        raise mismatch(kind, log_index, "the entry is not canonical JSON") from None


def fingerprint_leaf(fingerprint_id: str, log_index: int, envelope: object) -> dict[str, Any]:
    """The fingerprint envelope a ``fingerprints`` row points at; IndexMismatch unless the log
    holds that leaf and its body hashes to the row's ID."""
    what = f"fingerprint {fingerprint_id}"
    if envelope is None:
        raise mismatch(what, log_index, "the log holds no such leaf")
    data = stored_bytes(envelope)
    if data is None:
        raise mismatch(what, log_index, f"its envelope is stored as {type(envelope).__name__}")
    env, body_bytes = logged_envelope(data, log_index, FINGERPRINT_KIND)
    if sha256_digest(body_bytes) != fingerprint_id:
        raise mismatch(what, log_index, "the entry is another fingerprint")
    return env


@dataclass(frozen=True)
class LoggedFingerprint:
    """A ``fingerprints`` row read through its leaf: the leaf hashes to the row's ID."""

    fingerprint_id: str
    log_index: int
    key_id: str  # the row's; callers that answer with it compare it with the envelope's
    data: bytes  # the canonical envelope, as logged
    envelope: dict[str, Any]
    appended_at: datetime


def logged_fingerprints(
    session: Session, fingerprint_ids: Collection[str]
) -> dict[str, LoggedFingerprint]:
    """The fingerprints registered under ``fingerprint_ids``, each read through the leaf its
    row points at (a row the log does not back is IndexMismatch, never an answer)."""
    rows = session.execute(
        select(
            Fingerprint.fingerprint_id,
            Fingerprint.log_index,
            Fingerprint.key_id,
            LogEntry.envelope,
            LogEntry.appended_at,
        )
        .outerjoin(LogEntry, LogEntry.idx == Fingerprint.log_index)
        .where(Fingerprint.fingerprint_id.in_(fingerprint_ids))
    ).all()
    found = {}
    for fp_id, log_index, key_id, data, appended_at in rows:
        env = fingerprint_leaf(fp_id, log_index, data)
        found[fp_id] = LoggedFingerprint(
            fp_id, log_index, key_id, bytes(data), env, as_utc(appended_at)
        )
    return found


def record_leaf(
    request_id: str, log_index: int, content_hash: str, entry: tuple[bytes, datetime] | None
) -> StoredRecord:
    """The record a ``records`` row points at (``entry``: its leaf's envelope and append
    time); IndexMismatch unless the leaf is that request ID's record with the row's content
    hash."""
    what = f"record {request_id!r}"
    if entry is None:
        raise mismatch(what, log_index, "the log holds no such leaf")
    record = from_log(log_index, *entry)
    if record.request_id != request_id:
        raise mismatch(what, log_index, "the entry is the record of another request ID")
    if record.content_hash != content_hash:
        raise mismatch(what, log_index, "the entry holds other content")
    return record


_STRINGS = ("request_id", "fingerprint_id", "model", "pool", "worker_id", "endpoint")


def from_log(log_index: int, data: object, appended_at: datetime) -> StoredRecord:
    """The record log entry ``log_index`` holds; IndexMismatch if it holds none (or SQLite
    hands its envelope back as another type than bytes: stored so by an edit)."""
    stored = stored_bytes(data)
    if stored is None:
        raise mismatch("a record", log_index, f"its envelope is stored as {type(data).__name__}")
    env, body_bytes = logged_envelope(stored, log_index, RECORD_KIND)
    body = env["body"]
    key_id = env["signature"].get("key_id")
    tier = body.get("tier")
    aborted = body.get("aborted", False)
    if (
        not all(isinstance(body.get(name), str) for name in _STRINGS)
        or not isinstance(key_id, str)
        or not isinstance(tier, int)
        or isinstance(tier, bool)
        or not isinstance(aborted, bool)
    ):
        raise mismatch("a record", log_index, "the envelope is not a valid record")
    return StoredRecord(
        request_id=body["request_id"],
        log_index=log_index,
        content_hash=sha256_digest(body_bytes),
        fingerprint_id=body["fingerprint_id"],
        key_id=key_id,
        model=body["model"],
        tier=tier,
        pool=body["pool"],
        worker_id=body["worker_id"],
        endpoint=body["endpoint"],
        aborted=aborted,
        received_at=as_utc(appended_at),
        envelope=stored,
        body=body,
    )


# Columns, not the ORM entity: a record read is on the path of every lookup and evidence bundle,
# and loading an entity costs more than the query's round trip.
_ENTRY = (LogEntry.idx, LogEntry.envelope, LogEntry.appended_at)


def check_name(value: str, form: re.Pattern[str], message: str) -> None:
    """InvalidInput ``invalid_parameters`` unless ``value`` has the form of what it names: a
    lookup by a name nothing can have is refused alike on every database (Postgres refuses a
    NUL that SQLite would look up), and never echoes 10 KB back."""
    if not isinstance(value, str) or not form.fullmatch(value):
        raise InvalidInput(message, code="invalid_parameters")


def get_record(db: Database, request_id: str) -> StoredRecord:
    check_request_id(request_id)
    with db.read() as s:
        return record_in(s, request_id)


def record_in(session: Session, request_id: str) -> StoredRecord:
    found = session.execute(
        select(*_ENTRY)
        .join_from(Record, LogEntry, LogEntry.idx == Record.log_index)
        .where(Record.request_id == request_id)
    ).first()
    if found is None:
        raise not_found(request_id)
    record = from_log(found.idx, found.envelope, found.appended_at)
    if record.request_id != request_id:
        raise mismatch(
            f"request ID {request_id!r}",
            found.idx,
            f"the entry is the record of {record.request_id!r}",
        )
    (record,) = with_content(session, [record])
    record.check_content()
    return record


def with_content(session: Session, records: Sequence[StoredRecord]) -> list[StoredRecord]:
    """The records with their stored disclosures and erasure state, each erasure read
    through its leaf (v2 records; a v1 record's content is its leaf's). IndexMismatch when
    an ``erasures`` row names a leaf that is not the record's erasure event."""
    v2 = [r for r in records if r.body.get("schema_version") != 1]
    if not v2:
        return list(records)
    content = disclosures_at(session, [r.log_index for r in v2])
    erased = erased_ids(session, v2)
    return [
        content_applied(r, content.get(r.log_index, ()), False, erased.get(r.request_id))
        for r in records
    ]


def content_applied(
    record: StoredRecord,
    disclosures: Sequence[str],
    erased: bool,
    erasure: ErasureEvent | None = None,
) -> StoredRecord:
    """A v2 record with the disclosures stored for its leaf and its erasure state (a v1
    record as it is: its content is its leaf's)."""
    if record.body.get("schema_version") == 1:
        return record
    return record.with_disclosures(disclosures, erased, erasure)


def erased_ids(session: Session, records: Sequence[StoredRecord]) -> dict[str, ErasureEvent]:
    """The erasure events of these records that ``erasures`` holds rows for (request ID ->
    event), each read through the leaf its row names: one statement per 500 records.
    IndexMismatch when a row names a leaf that is not that record's erasure event."""
    by_id = {r.request_id: r for r in records}
    ids = sorted(by_id)
    out: dict[str, ErasureEvent] = {}
    for start in range(0, len(ids), 500):
        rows = session.execute(
            select(Erasure.request_id, Erasure.log_index, LogEntry.envelope)
            .outerjoin(LogEntry, LogEntry.idx == Erasure.log_index)
            .where(Erasure.request_id.in_(ids[start : start + 500]))
        )
        for rid, idx, envelope in rows:
            out[rid] = record_erasure(by_id[rid], idx, envelope)
    return out


def record_erasure(record: StoredRecord, log_index: Any, envelope: Any) -> ErasureEvent:
    """``logged_erasure`` for a record read from its log entry."""
    return logged_erasure(
        envelope,
        log_index,
        request_id=record.request_id,
        record_index=record.log_index,
        content_hash=record.content_hash,
        digests=record.body.get("disclosure_digests"),
    )


def logged_erasure(
    envelope: Any,
    log_index: Any,
    *,
    request_id: str,
    record_index: int,
    content_hash: str,
    digests: Any,
) -> ErasureEvent:
    """The erasure event an ``erasures`` row of ``request_id`` points to (``log_index``, its
    leaf's ``envelope``), which must be what ``ledger.erasure.erasure_body`` logs for this
    record: an ``erasure`` envelope naming this request ID, this record's leaf and content
    hash, and every digest of its body among ``erased_digests``, logged after the record.
    IndexMismatch otherwise (the log holding no such leaf included): an edited row never
    makes a record erased, nor hides one from an erasure."""
    problem = _erasure_problem(envelope, log_index, request_id, record_index, content_hash, digests)
    if problem is not None:
        raise mismatch(
            f"the erasure of {request_id!r}",
            log_index if type(log_index) is int else -1,
            problem,
            request_id=request_id,
        )
    data = bytes(envelope)
    return ErasureEvent(log_index, data, orjson.loads(data)["body"])


def _erasure_problem(
    envelope: Any,
    log_index: Any,
    request_id: str,
    record_index: int,
    content_hash: str,
    digests: Any,
) -> str | None:
    if envelope is None or type(log_index) is not int:
        return "the log holds no such leaf"
    try:
        env = orjson.loads(bytes(envelope))
        body = env["body"]
        if env["kind"] != ERASURE_KIND:
            return f"the leaf holds a {env['kind']!r} envelope, not an erasure event"
        if body["request_id"] != request_id:
            return "the leaf is the erasure event of another record"
        about, erased = body["record"], body["erased_digests"]
        if about["log_index"] != record_index or about["content_hash"] != content_hash:
            return "the erasure event names another leaf or version of the record"
        if log_index <= record_index:
            return "the erasure event is logged before the record"
        if not isinstance(erased, list) or not set(digests or ()) <= set(erased):
            return "the erasure event does not name every digest of the record"
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "the leaf is not an erasure event"
    return None


def disclosures_at(session: Session, log_indexes: Iterable[int]) -> dict[int, list[str]]:
    """The stored disclosures committed by each of these leaves (log index -> encoded)."""
    out: dict[int, list[str]] = {}
    wanted = sorted(set(log_indexes))
    for start in range(0, len(wanted), 500):
        rows = session.execute(
            select(Disclosure.log_index, Disclosure.disclosure)
            .where(Disclosure.log_index.in_(wanted[start : start + 500]))
            .order_by(Disclosure.log_index, Disclosure.digest)
        )
        for idx, encoded in rows:
            out.setdefault(idx, []).append(encoded)
    return out


def not_found(request_id: str) -> NotFound:
    return NotFound(f"no record with request ID {request_id!r}", code="record_not_found")


@dataclass(frozen=True)
class RecordFilter:
    since: datetime | None = None
    until: datetime | None = None
    model: str | None = None
    fingerprint_id: str | None = None
    tier: int | None = None
    pool: str | None = None

    def check(self) -> None:
        """Refuse a filter no record could satisfy because it is malformed (422)."""
        for name, value in (("since", self.since), ("until", self.until)):
            if value is not None and value.tzinfo is None:
                raise InvalidInput(
                    f"{name} must carry a time zone (e.g. Z)", code="invalid_time_range"
                )
        if self.since and self.until and self.since >= self.until:
            raise InvalidInput("since must be earlier than until", code="invalid_time_range")
        if self.model is not None and (
            not 1 <= len(self.model) <= MAX_MODEL
            or "\x00" in self.model
            or not _is_text(self.model)
        ):
            raise _bad(f"model must be 1-{MAX_MODEL} characters of text, without NUL")
        if self.fingerprint_id is not None and not FINGERPRINT_ID.fullmatch(self.fingerprint_id):
            raise _bad("fingerprint_id must be sha256: and 64 lowercase hex digits")
        if self.pool is not None and not NAME.fullmatch(self.pool):
            raise _bad("pool must be 1-100 characters of A-Z a-z 0-9 . _ -")
        if self.tier is not None and (isinstance(self.tier, bool) or self.tier not in (0, 1, 2)):
            raise _bad("tier must be 0, 1 or 2")

    def matches(self, record: StoredRecord) -> bool:
        """Whether the record, as logged, satisfies every given filter."""
        return (
            (self.since is None or record.received_at >= self.since)
            and (self.until is None or record.received_at < self.until)
            and (self.model is None or record.model == self.model)
            and (self.fingerprint_id is None or record.fingerprint_id == self.fingerprint_id)
            and (self.tier is None or record.tier == self.tier)
            and (self.pool is None or record.pool == self.pool)
        )


def parse_time(text: str | None, name: str) -> datetime | None:
    """An RFC 3339 date-time with its zone offset (``Z`` or ±hh:mm), as aware UTC. Anything
    else (junk, no zone, a date alone, a time outside years 1-9999 once in UTC) is InvalidInput
    ``invalid_time_range``, never a crash. A time finer than microseconds is rounded up to
    the next microsecond: stored times have microseconds, so ``since <= t`` and ``t < until``
    then hold exactly as they would for the finer time."""
    if text is None:
        return None
    try:
        return parse_rfc3339(text, round_up=True)
    except ValueError as exc:
        if LOCAL_TIME.fullmatch(text):
            raise InvalidInput(
                f"{name} must carry a time zone (e.g. Z)", code="invalid_time_range"
            ) from None
        raise InvalidInput(
            f"{name} must be an RFC 3339 time such as 2026-12-01T09:00:00Z ({exc})",
            code="invalid_time_range",
        ) from None


def _bad(message: str) -> InvalidInput:
    return InvalidInput(message, code="invalid_parameters")


def encode_cursor(log_index: int) -> str:
    return base64.urlsafe_b64encode(f"v1:{log_index}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        if len(cursor) > 64:
            raise ValueError("too long")
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, _, value = text.partition(":")
        if version != "v1" or not _CURSOR_VALUE.fullmatch(value) or int(value) >= 2**63:
            raise ValueError(version)
        return int(value)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidInput("cursor is not one this ledger issued", code="invalid_cursor") from exc


_Q = TypeVar("_Q", bound=Select)  # type: ignore[type-arg]


def filtered(q: _Q, flt: RecordFilter, received_at: Any) -> _Q:
    """``q`` (over ``records``) narrowed to the rows whose index columns match ``flt``, the
    time range on ``received_at``. The index only selects candidates: callers keep a row only
    if its logged record matches (``RecordFilter.matches``)."""
    if flt.since is not None:
        q = q.where(received_at >= flt.since)
    if flt.until is not None:
        q = q.where(received_at < flt.until)
    if flt.model is not None:
        q = q.where(Record.model == flt.model)
    if flt.fingerprint_id is not None:
        q = q.where(Record.fingerprint_id == flt.fingerprint_id)
    if flt.tier is not None:
        q = q.where(Record.tier == flt.tier)
    if flt.pool is not None:
        q = q.where(Record.pool == flt.pool)
    return q


def _is_text(value: str) -> bool:
    """Whether a string is Unicode text (JSON can escape a lone surrogate into one)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
