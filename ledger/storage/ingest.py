"""Ingest of signed fingerprints and inference-record batches.

A record batch is atomic: every envelope is parsed, validated and verified first; if any
item fails, the whole batch is refused with an error naming the item's index and nothing is
written. Otherwise all new items are appended to the log and indexed in one transaction.
A request ID already held with identical content (same canonical body) is an idempotent
success (``"duplicate"``); with different content the batch is refused with a 409.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from ledger.errors import Conflict, InvalidInput, LedgerError, NotFound
from ledger.fingerprint import FINGERPRINT_KIND, validate_fingerprint_body
from ledger.inference_record import InferenceRecord, parse_record
from ledger.records import RECORD_KIND, RecordSummary
from ledger.signing import Envelope
from ledger.storage import cache, keystore, log
from ledger.storage.bulk import insert_rows
from ledger.storage.database import Database, as_utc, utcnow
from ledger.storage.models import Disclosure, Fingerprint, Record


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
    with db.read() as s:
        keystore.check_signer(env, keystore.load_keys(s, [env.key_id]))
    with db.write() as s:
        keystore.require_unrevoked(s, [env.key_id])
        row = s.get(Fingerprint, fp_id)
        if row is not None:
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
    with db.read() as s:
        row = s.get(Fingerprint, fingerprint_id)
        if row is None:
            raise NotFound(f"no fingerprint {fingerprint_id}", code="fingerprint_not_found")
        env = log.read_envelope(s, row.log_index)
    assert env is not None
    return StoredFingerprint(
        fingerprint_id, row.log_index, as_utc(row.registered_at).isoformat(), env
    )


def _check_items(items: Sequence[RecordItem]) -> list[_Checked]:
    checked = []
    for i, item in enumerate(items):
        try:
            env = parse_envelope(item.envelope, RECORD_KIND)
            record = parse_record(env.body, item.disclosures, complete=True)
        except LedgerError as exc:
            raise exc.with_details(item=i) from None
        checked.append(_Checked(env, record, env.body_digest))
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


def ingest_records(db: Database, batch: Sequence[RecordItem | Any]) -> list[IngestResult]:
    """Validate, verify and append a batch of records atomically (a v2 record with all of
    its disclosures, which are stored apart from the log). An item that is not a RecordItem
    is an envelope without disclosures."""
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

    # Signatures are verified before the append lock is taken (it is the costly part) ...
    key_ids = {c.envelope.key_id for c in checked}
    with db.read() as s:
        keys = keystore.load_keys(s, key_ids)
        keyed = cache.prepare(s, [checked[i].record for i in first.values()])
    for i, c in enumerate(checked):
        try:
            keystore.check_signer(c.envelope, keys)
        except LedgerError as exc:
            raise exc.with_details(item=i) from None

    with db.write() as s:
        # ... and the keys re-read under the lock, so a revocation that raced us still wins.
        keystore.require_unrevoked(s, key_ids)
        _check_fingerprints(s, checked)
        existing = _existing(s, list(first))
        new: list[_Checked] = []
        results: dict[str, IngestResult] = {}
        for rid, i in first.items():
            c = checked[i]
            held = existing.get(rid)
            if held is None:
                new.append(c)
                continue
            if held[1] != c.content_hash:
                raise Conflict(
                    f"request ID {rid!r} is already recorded with different content "
                    f"(held {held[1]}, sent {c.content_hash})",
                    code="record_conflict",
                    details={
                        "request_id": rid,
                        "item": i,
                        "held_content_hash": held[1],
                        "sent_content_hash": c.content_hash,
                        "log_index": held[0],
                    },
                )
            results[rid] = IngestResult(rid, "duplicate", held[0], held[1])
        at = utcnow()
        indexes = log.append(s, [c.envelope for c in new], at)
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
                for c, idx in zip(new, indexes, strict=True)
            ],
        )
        cache.index_records(
            s,
            [(keyed[c.summary.request_id], idx) for c, idx in zip(new, indexes, strict=True)],
        )
        insert_rows(
            s,
            Disclosure,
            ("request_id", "digest", "log_index", "disclosure"),
            [
                (c.summary.request_id, d.digest, idx, d.encoded)
                for c, idx in zip(new, indexes, strict=True)
                for d in c.record.disclosed.values()
            ],
        )
        for c, idx in zip(new, indexes, strict=True):
            rid = c.summary.request_id
            results[rid] = IngestResult(rid, "created", idx, c.content_hash)
    out: list[IngestResult] = []
    for i, c in enumerate(checked):
        rid = c.summary.request_id
        result = results[rid]
        if first[rid] != i:  # a repeat inside this batch
            result = IngestResult(rid, "duplicate", result.log_index, result.content_hash)
        out.append(result)
    return out


def _check_fingerprints(s: Session, checked: list[_Checked]) -> None:
    wanted = {c.summary.fingerprint_id for c in checked}
    known = set(
        s.execute(
            select(Fingerprint.fingerprint_id).where(Fingerprint.fingerprint_id.in_(wanted))
        ).scalars()
    )
    for i, c in enumerate(checked):
        if c.summary.fingerprint_id not in known:
            raise InvalidInput(
                f"record {c.summary.request_id!r} names fingerprint "
                f"{c.summary.fingerprint_id}, which is not registered",
                code="unknown_fingerprint",
                details={"item": i, "fingerprint_id": c.summary.fingerprint_id},
            )


def _existing(s: Session, request_ids: list[str]) -> dict[str, tuple[int, str]]:
    found: dict[str, tuple[int, str]] = {}
    for start in range(0, len(request_ids), 500):
        chunk = request_ids[start : start + 500]
        rows = s.execute(
            select(Record.request_id, Record.log_index, Record.content_hash).where(
                Record.request_id.in_(chunk)
            )
        ).all()
        found.update({r.request_id: (r.log_index, r.content_hash) for r in rows})
    return found
