"""Ingest of signed fingerprints and inference-record batches.

A record batch is atomic: every envelope is parsed, validated and verified first; if any
item fails, the whole batch is refused with an error naming the item's index and nothing is
written. Otherwise all new items are appended to the log and indexed in one transaction.
A request ID already held with identical content (same canonical body) is an idempotent
success (``"duplicate"``); with different content the batch is refused with a 409.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from ledger.cachekey import CHAT
from ledger.clock import parse_rfc3339, rfc3339
from ledger.errors import (
    Conflict,
    InvalidInput,
    LedgerError,
    NotFound,
    Pushback,
    VerificationError,
)
from ledger.fingerprint import FINGERPRINT_KIND, validate_fingerprint_body
from ledger.inference_record import InferenceRecord, as_logged, parse_record
from ledger.nesting import check_depth
from ledger.records import RECORD_KIND, STARTED_SKEW, RecordSummary
from ledger.signing import Envelope
from ledger.storage import cache, keystore, log, registered
from ledger.storage.bulk import insert_rows
from ledger.storage.database import Database, utcnow
from ledger.storage.models import Disclosure, Fingerprint, LogEntry, Record, Salt
from ledger.storage.queries import (
    FINGERPRINT_ID,
    check_name,
    logged_fingerprints,
    mismatch,
    record_leaf,
)


@dataclass(frozen=True)
class IngestResult:
    request_id: str
    status: str  # "created" | "duplicate"
    log_index: int
    content_hash: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "status": self.status,
            "log_index": self.log_index,
            "content_hash": self.content_hash,
        }


@dataclass(frozen=True)
class FingerprintResult:
    fingerprint_id: str
    status: str
    log_index: int
    key_id: str


@dataclass(frozen=True)
class _Checked:
    envelope: Envelope
    record: InferenceRecord
    content_hash: str
    salts: tuple[tuple[bytes, ...], ...] = ()  # each disclosure's salt_keys, in order

    @property
    def summary(self) -> RecordSummary:
        return self.record.summary


@dataclass(frozen=True)
class RecordItem:
    """One item of a batch: a signed record envelope and, for schema v2, its disclosures."""

    envelope: Any
    disclosures: Sequence[Any] = ()


def parse_envelope(data: Any, expected_kind: str) -> Envelope:
    env = Envelope.from_dict(data)
    if env.kind != expected_kind:
        raise InvalidInput(
            f"expected an envelope of kind {expected_kind!r}, got {env.kind!r}",
            code="wrong_kind",
        )
    return env


def add_fingerprint(db: Database, data: Any) -> FingerprintResult:
    env = parse_envelope(data, FINGERPRINT_KIND)
    fp_id = validate_fingerprint_body(env.body)
    check_depth(env.body, "fingerprint")  # at ingest: what is logged verifies everywhere
    with db.read() as s:
        keystore.check_signer(env, keystore.load_keys(s, [env.key_id]))
    with db.write() as s:
        keystore.require_unrevoked(s, [env.key_id])
        row = logged_fingerprints(s, [fp_id]).get(fp_id)
        if row is not None:  # a duplicate only when the log holds it (an edited row is not)
            if row.envelope["signature"].get("key_id") != row.key_id:
                raise mismatch(f"fingerprint {fp_id}", row.log_index, "another key signed it")
            return FingerprintResult(fp_id, "duplicate", row.log_index, row.key_id)
        at = utcnow()
        (idx,) = log.append(s, [env], at)
        s.execute(
            insert(Fingerprint),
            [
                {
                    "fingerprint_id": fp_id,
                    "key_id": env.key_id,
                    "log_index": idx,
                    "registered_at": at,
                }
            ],
        )
    return FingerprintResult(fp_id, "created", idx, env.key_id)


@dataclass(frozen=True)
class StoredFingerprint:
    fingerprint_id: str
    log_index: int
    registered_at: str
    envelope: bytes  # canonical envelope bytes, as logged


def get_fingerprint(db: Database, fingerprint_id: str) -> StoredFingerprint:
    """A registered fingerprint as its leaf holds it, registered when the leaf was appended
    (an index row naming another leaf is IndexMismatch, never an answer)."""
    check_name(fingerprint_id, FINGERPRINT_ID, "a fingerprint ID is sha256: and 64 hex digits")
    with db.read() as s:
        row = logged_fingerprints(s, [fingerprint_id]).get(fingerprint_id)
    if row is None:
        raise NotFound(f"no fingerprint {fingerprint_id}", code="fingerprint_not_found")
    return StoredFingerprint(fingerprint_id, row.log_index, rfc3339(row.appended_at), row.data)


def _check_items(items: Sequence[RecordItem]) -> list[_Checked]:
    checked = []
    for i, item in enumerate(items):
        try:
            env = parse_envelope(item.envelope, RECORD_KIND)
            record = parse_record(env.body, item.disclosures, complete=True)
            record = as_logged(record, env.body_read_back())  # rows as the audit derives them
        except LedgerError as exc:
            raise exc.with_details(item=i) from None
        checked.append(_Checked(env, record, env.body_digest, record.salt_keys))
    return checked


_RECORD_COLUMNS = (
    "request_id",
    "log_index",
    "content_hash",
    "fingerprint_id",
    "key_id",
    "model",
    "tier",
    "pool",
    "worker_id",
    "endpoint",
    "received_at",
)


@dataclass(frozen=True)
class CheckedBatch:
    """A batch parsed, validated and signature-checked outside the append lock: what
    ``write_batches`` needs to append it."""

    checked: list[_Checked]
    first: dict[str, int]  # request ID -> index of its first item in the batch
    keyed: dict[str, cache.Keyed]
    key_ids: frozenset[str]
    # The chat records' fingerprints not registered when the keys were computed (so keyed
    # without a chat template): registered by the time of the append, they are keyed again.
    untemplated: frozenset[str] = frozenset()

    def __len__(self) -> int:
        return len(self.checked)


def check_batch(db: Database, batch: Sequence[RecordItem | Any]) -> CheckedBatch:
    """Everything about a batch that needs no lock: parse and validate every item, refuse a
    request ID repeated with different content, verify every signature against its key and
    compute the cache keys. An item that is not a RecordItem is an envelope without
    disclosures."""
    items = [i if isinstance(i, RecordItem) else RecordItem(i) for i in batch]
    if not items:
        raise InvalidInput("a batch must hold at least one envelope", code="empty_batch")
    checked = _check_items(items)
    # Within the batch: identical repeats collapse, different content under one ID conflicts.
    first: dict[str, int] = {}
    for i, c in enumerate(checked):
        rid = c.summary.request_id
        if rid in first and checked[first[rid]].content_hash != c.content_hash:
            raise Conflict(
                f"request ID {rid!r} appears twice in the batch with different content",
                code="record_conflict",
                details={"request_id": rid, "item": i, "first_item": first[rid]},
            )
        first.setdefault(rid, i)

    # Signatures are verified before the append lock is taken (it is the costly part); the
    # keys are re-read under the lock, so a revocation that raced us still wins.
    key_ids = frozenset(c.envelope.key_id for c in checked)
    keys = registered.signer_keys(db, key_ids)
    records = [checked[i].record for i in first.values()]
    chat = {r.fingerprint_id for r in records if r.endpoint == CHAT}
    templates = registered.chat_templates(db, chat)
    keyed = cache.prepare(records, templates)
    for i, c in enumerate(checked):
        try:
            keystore.check_signer(c.envelope, keys)
        except LedgerError as exc:
            raise exc.with_details(item=i) from None
    return CheckedBatch(checked, first, keyed, key_ids, frozenset(chat - set(templates)))


def _rekey_late_templates(s: Session, b: CheckedBatch, known: set[str]) -> None:
    """Key again, under the append lock, the chat records of ``b`` whose fingerprint was
    registered after their keys were computed (without its chat template, they would be
    indexed under keys a lookup never makes, and the audit would name them)."""
    late = b.untemplated & known
    if not late:
        return
    templates = {fp: cache.chat_template_digest(cache.fingerprint_body(s, fp)) for fp in late}
    records = [b.checked[i].record for i in b.first.values()]
    b.keyed.update(cache.prepare([r for r in records if r.fingerprint_id in late], templates))


def ingest_records(db: Database, batch: Sequence[RecordItem | Any]) -> list[IngestResult]:
    """Validate, verify and append a batch of records atomically (a v2 record with all of
    its disclosures, which are stored apart from the log)."""
    (outcome,) = write_batches(db, [check_batch(db, batch)])
    if isinstance(outcome, LedgerError):
        raise outcome
    return outcome


Outcome = list[IngestResult] | LedgerError


def write_batches(db: Database, batches: Sequence[CheckedBatch]) -> list[Outcome]:
    """Append checked batches in one transaction (group commit: one lock, one log append,
    one commit for all), each keeping its own atomicity: a batch refused under the lock
    (revoked key, unknown fingerprint, request ID held with other content) gets its error
    and writes nothing; the others are written as if they had come one after the other, in
    order, so a request ID in two of them is a duplicate (or a conflict) of the first.

    Should the joint transaction fail at the database, each batch is tried again alone, so
    that one batch the database refuses does not fail the others."""
    try:
        with db.write() as s:
            return _write(s, batches)
    except LedgerError as exc:
        if len(batches) == 1:
            return [exc]
    return [write_batches(db, [b])[0] for b in batches]


@dataclass
class _Plan:
    """One batch's place in a group: its new records and, per request ID, where its result
    comes from (a held row, or a record new in this group)."""

    batch: CheckedBatch
    held: dict[str, tuple[int, str]]  # request ID -> (log index, content hash) already held
    new: dict[str, int]  # request ID -> position among the group's new records


def _write(s: Session, batches: Sequence[CheckedBatch]) -> list[Outcome]:
    key_ids = frozenset().union(*(b.key_ids for b in batches))
    revoked = keystore.revoked_among(s, key_ids)
    known = _registered(s, {c.summary.fingerprint_id for b in batches for c in b.checked})
    existing = _existing(s, list(dict.fromkeys(rid for b in batches for rid in b.first)))
    new: list[tuple[CheckedBatch, _Checked]] = []
    position: dict[str, int] = {}  # request ID -> position in new
    plans: list[_Plan | LedgerError] = []
    # Every salt of the group looked up at once, under the lock (one query; a session per
    # batch outside it cost more than the query in a fleet of small batches).
    accepted = _accepted_salts(
        s, [k for b in batches for c in b.checked for ks in c.salts for k in ks]
    )
    at = utcnow()  # under the append lock: the receive time of every record appended here
    group_salts: dict[bytes, str] = {}  # salt key -> request ID of a record appended here
    for b in batches:
        try:
            plan = _plan(b, revoked, known, existing, new, position, at)
            _rekey_late_templates(s, b, known)
            _check_fresh_salts(b, plan, accepted, group_salts)  # the last refusal: it keeps
            plans.append(plan)
        except LedgerError as exc:
            plans.append(exc)
            continue
        for rid, place in plan.new.items():
            if place < 0:  # new in this batch: its place among the group's appends
                plan.new[rid] = position[rid] = len(new)
                new.append((b, b.checked[b.first[rid]]))
    indexes = log.append(s, [c.envelope for _, c in new], at)
    insert_rows(
        s,
        Record,
        _RECORD_COLUMNS,
        [
            (
                c.summary.request_id,
                idx,
                c.content_hash,
                c.summary.fingerprint_id,
                c.envelope.key_id,
                c.summary.model,
                c.summary.tier,
                c.summary.pool,
                c.summary.worker_id,
                c.summary.endpoint,
                at,
            )
            for (_, c), idx in zip(new, indexes, strict=True)
        ],
    )
    cache.index_records(
        s,
        [(b.keyed[c.summary.request_id], idx) for (b, c), idx in zip(new, indexes, strict=True)],
    )
    insert_rows(
        s,
        Disclosure,
        ("request_id", "digest", "log_index", "disclosure"),
        [
            (c.summary.request_id, d.digest, idx, d.encoded)
            for (_, c), idx in zip(new, indexes, strict=True)
            for d in c.record.disclosed.values()
        ],
    )
    insert_rows(
        s,
        Salt,
        ("salt_key", "log_index"),
        [
            (key, idx)
            for (_, c), idx in zip(new, indexes, strict=True)
            for keys in c.salts
            for key in keys
        ],
    )
    return [
        plan if isinstance(plan, LedgerError) else _results(plan, new, indexes) for plan in plans
    ]


SALT_KEY_BYTES = 32  # a salt key is a SHA-256 digest (ledger.disclosures.salt_keys)
_ACCEPTED_SALTS = (
    "SELECT salt_key, log_index FROM salts WHERE salt_key IN (SELECT substring(%(keys)s::bytea"
    f" FROM n * {SALT_KEY_BYTES} + 1 FOR {SALT_KEY_BYTES}) FROM generate_series(0, %(count)s - 1)"
    " AS n)"
)


def _accepted_salts(s: Session, keys: list[bytes]) -> dict[bytes, int]:
    """Which of these salt keys the ledger accepted: key -> the leaf that committed to it."""
    if not keys:  # schema v1 records have none
        return {}
    if s.get_bind().dialect.name == "postgresql":
        # One bytea parameter holding every key, cut apart by the server: a list parameter
        # (= ANY(%s)) is adapted one key at a time, which cost the worker more than the query.
        assert all(len(key) == SALT_KEY_BYTES for key in keys)
        conn = s.connection().connection.driver_connection
        assert isinstance(conn, psycopg.Connection)
        with conn.cursor() as cur:
            cur.execute(_ACCEPTED_SALTS, {"keys": b"".join(keys), "count": len(keys)})
            return {bytes(key): idx for key, idx in cur}
    accepted: dict[bytes, int] = {}
    for start in range(0, len(keys), 1000):
        chunk = keys[start : start + 1000]
        rows = s.execute(select(Salt.salt_key, Salt.log_index).where(Salt.salt_key.in_(chunk)))
        accepted.update((bytes(key), idx) for key, idx in rows)
    return accepted


def _check_fresh_salts(
    b: CheckedBatch, plan: _Plan, accepted: dict[bytes, int], group: dict[bytes, str]
) -> None:
    """Refuse batch ``b`` when a record it appends holds a salt the ledger accepted before
    (``accepted``), one a record appended before it in the group holds (``group``), or one an
    earlier record of the batch holds; else add its records' salts to ``group``. A disclosed
    salt would confirm guesses of the other record's content, erased or withheld."""
    mine: dict[bytes, tuple[str, int]] = {}  # salt key -> (request ID, item)
    for rid, place in plan.new.items():
        if place >= 0:  # appended earlier in the group: its salts are there
            continue
        i = b.first[rid]
        c = b.checked[i]
        for j, (d, keys) in enumerate(zip(c.record.disclosed.values(), c.salts, strict=True)):
            for key in keys:
                if key not in accepted and key not in group and key not in mine:
                    continue
                details: dict[str, Any] = {"check": "salt", "item": i, "disclosure": j}
                if key in accepted:
                    where = f"a salt the ledger accepted before (leaf {accepted[key]})"
                    details["log_index"] = accepted[key]
                elif key in group:
                    where = f"the salt of record {group[key]!r}"
                    details["request_id"] = group[key]
                else:
                    where = f"the salt of item {mine[key][1]} of this batch"
                    details["first_item"] = mine[key][1]
                raise VerificationError(
                    f"disclosure {j} ({d.member}) of record {rid!r} reuses {where}: each salt "
                    "must be fresh random bytes, never another record's (a disclosure of one "
                    "would confirm guesses of the other's content, erased or withheld)",
                    code="invalid_disclosure",
                    details={**details, "member": d.member},
                )
        for keys in c.salts:
            for key in keys:
                mine[key] = (rid, i)
    group.update((key, rid) for key, (rid, _) in mine.items())


def _check_started(c: _Checked, item: int, at: datetime) -> None:
    """A new record's start time is RFC 3339 (``ledger.clock``; older records were read more
    loosely, and still are), and no later than ``at`` plus ``STARTED_SKEW``: else its receive
    time would be before its start, which the audit reports as a time moved back. That
    collector's clock runs ahead, so the record is held off (503 with Retry-After, which every
    shipper retries) until the ledger's clock catches up."""
    timings = c.envelope.body.get("timings")
    if not isinstance(timings, dict) or "started_at" not in timings:
        return
    try:
        started = parse_rfc3339(timings["started_at"])
    except ValueError as exc:
        raise InvalidInput(
            f"timings.started_at: {exc}", code="schema_violation", details={"item": item}
        ) from None
    if started > at + STARTED_SKEW:
        wait = (started - at - STARTED_SKEW).total_seconds()
        raise Pushback(
            f"record {c.summary.request_id!r} says its request started at "
            f"{rfc3339(started)}, more than {STARTED_SKEW.seconds} s after the ledger received "
            f"it ({rfc3339(at)}): is the collector's clock right? Send it again later",
            code="record_from_the_future",
            retry_after=math.ceil(wait),
            details={"item": item, "started_at": rfc3339(started)},
        )


def _plan(
    b: CheckedBatch,
    revoked: set[str],
    known: set[str],
    existing: dict[str, tuple[int, str]],
    new: list[tuple[CheckedBatch, _Checked]],
    position: dict[str, int],
    at: datetime,
) -> _Plan:
    """Where each record of ``b`` stands against what is held and what the group appends
    before it (at ``at``); raises the batch's refusal."""
    for key_id in sorted(b.key_ids & revoked):
        raise VerificationError(
            f"key {key_id} is revoked (read again when the batch was appended): "
            "nothing it signed is appended",
            code="revoked_key",
            details={"key_id": key_id},
        )
    for i, c in enumerate(b.checked):
        if c.summary.fingerprint_id not in known:
            raise InvalidInput(
                f"record {c.summary.request_id!r} names fingerprint "
                f"{c.summary.fingerprint_id}, which is not registered",
                code="unknown_fingerprint",
                details={"item": i, "fingerprint_id": c.summary.fingerprint_id},
            )
    plan = _Plan(b, {}, {})
    for rid, i in b.first.items():
        c = b.checked[i]
        if rid in position:  # appended earlier in this group: held once it commits
            earlier = new[position[rid]][1].content_hash
            if earlier != c.content_hash:
                raise _held_conflict(rid, i, earlier, c.content_hash, None)
            plan.new[rid] = position[rid]
            continue
        held = existing.get(rid)
        if held is None:
            _check_started(c, i, at)
            plan.new[rid] = -1  # a new record, placed by the caller
        elif held[1] != c.content_hash:
            raise _held_conflict(rid, i, held[1], c.content_hash, held[0])
        else:
            plan.held[rid] = held
    return plan


def _held_conflict(rid: str, item: int, held: str, sent: str, log_index: int | None) -> Conflict:
    details: dict[str, Any] = {
        "request_id": rid,
        "item": item,
        "held_content_hash": held,
        "sent_content_hash": sent,
    }
    if log_index is not None:
        details["log_index"] = log_index
    return Conflict(
        f"request ID {rid!r} is already recorded with different content (held {held}, sent {sent})",
        code="record_conflict",
        details=details,
    )


def _results(
    plan: _Plan, new: list[tuple[CheckedBatch, _Checked]], indexes: list[int]
) -> list[IngestResult]:
    """The batch's answer, item by item: created for the records this batch appended,
    duplicate for the rest (held before, appended earlier in the group, or repeated)."""
    b = plan.batch
    out: list[IngestResult] = []
    for i, c in enumerate(b.checked):
        rid = c.summary.request_id
        if rid in plan.held:
            idx, content_hash = plan.held[rid]
            out.append(IngestResult(rid, "duplicate", idx, content_hash))
            continue
        at = plan.new[rid]
        status = "created" if new[at][0] is b and b.first[rid] == i else "duplicate"
        out.append(IngestResult(rid, status, indexes[at], c.content_hash))
    return out


def _registered(s: Session, fingerprint_ids: set[str]) -> set[str]:
    """The fingerprints among ``fingerprint_ids`` the log holds, each read through its leaf
    (a row the log does not back is IndexMismatch: no record is logged under it)."""
    return set(logged_fingerprints(s, fingerprint_ids))


def _existing(s: Session, request_ids: list[str]) -> dict[str, tuple[int, str]]:
    """The records held under ``request_ids``: (log index, content hash), each read through
    its leaf, so a resend is answered ``duplicate`` only for a record the log holds (a row
    the log does not back is IndexMismatch, never a reason to drop a collector's record)."""
    found: dict[str, tuple[int, str]] = {}
    for start in range(0, len(request_ids), 500):
        chunk = request_ids[start : start + 500]
        rows = s.execute(
            select(
                Record.request_id,
                Record.log_index,
                Record.content_hash,
                LogEntry.envelope,
                LogEntry.appended_at,
            )
            .outerjoin(LogEntry, LogEntry.idx == Record.log_index)
            .where(Record.request_id.in_(chunk))
        ).all()
        for rid, log_index, content_hash, envelope, appended_at in rows:
            entry = None if envelope is None else (envelope, appended_at)
            record_leaf(rid, log_index, content_hash, entry)
            found[rid] = (log_index, content_hash)
    return found
