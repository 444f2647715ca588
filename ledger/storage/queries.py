"""Reading records back: by request ID, and searched with cursor pagination."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.errors import InvalidInput, NotFound
from ledger.storage.database import Database, as_utc
from ledger.storage.models import LogEntry, Record

MAX_PAGE = 1000
_CURSOR_VALUE = re.compile(r"0|[1-9][0-9]{0,18}")


@dataclass(frozen=True)
class StoredRecord:
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
    received_at: datetime
    envelope: bytes  # canonical envelope bytes, exactly as logged

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
            "received_at": self.received_at.isoformat(),
        }


@dataclass(frozen=True)
class RecordFilter:
    since: datetime | None = None
    until: datetime | None = None
    model: str | None = None
    fingerprint_id: str | None = None
    tier: int | None = None
    pool: str | None = None


@dataclass(frozen=True)
class Page:
    items: list[StoredRecord]
    next_cursor: str | None


# Columns, not the ORM entity: a record read is on the path of every lookup and evidence bundle,
# and loading an entity costs more than the query's round trip.
_COLUMNS = (*Record.__table__.columns, LogEntry.envelope)


def _stored(row: Any) -> StoredRecord:
    return StoredRecord(
        request_id=row.request_id,
        log_index=row.log_index,
        content_hash=row.content_hash,
        fingerprint_id=row.fingerprint_id,
        key_id=row.key_id,
        model=row.model,
        tier=row.tier,
        pool=row.pool,
        worker_id=row.worker_id,
        endpoint=row.endpoint,
        received_at=as_utc(row.received_at),
        envelope=row.envelope,
    )


def get_record(db: Database, request_id: str) -> StoredRecord:
    with db.read() as s:
        return record_in(s, request_id)


def record_in(session: Session, request_id: str) -> StoredRecord:
    found = session.execute(
        select(*_COLUMNS)
        .join_from(Record, LogEntry, LogEntry.idx == Record.log_index)
        .where(Record.request_id == request_id)
    ).first()
    if found is None:
        raise not_found(request_id)
    return _stored(found)


def not_found(request_id: str) -> NotFound:
    return NotFound(f"no record with request ID {request_id!r}", code="record_not_found")


def encode_cursor(log_index: int) -> str:
    return base64.urlsafe_b64encode(f"v1:{log_index}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, _, value = text.partition(":")
        if version != "v1" or not _CURSOR_VALUE.fullmatch(value) or int(value) >= 2**63:
            raise ValueError(version)
        return int(value)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidInput("cursor is not one this ledger issued", code="invalid_cursor") from exc


def search_records(
    db: Database, flt: RecordFilter, *, limit: int = 100, cursor: str | None = None
) -> Page:
    """Records in log order matching every given filter; ``next_cursor`` continues the scan."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit must be 1..{MAX_PAGE}", code="invalid_limit")
    if flt.since and flt.until and flt.since >= flt.until:
        raise InvalidInput("since must be earlier than until", code="invalid_time_range")
    q = select(*_COLUMNS).join_from(Record, LogEntry, LogEntry.idx == Record.log_index)
    if cursor is not None:
        q = q.where(Record.log_index > decode_cursor(cursor))
    if flt.since is not None:
        q = q.where(Record.received_at >= flt.since)
    if flt.until is not None:
        q = q.where(Record.received_at < flt.until)
    if flt.model is not None:
        q = q.where(Record.model == flt.model)
    if flt.fingerprint_id is not None:
        q = q.where(Record.fingerprint_id == flt.fingerprint_id)
    if flt.tier is not None:
        q = q.where(Record.tier == flt.tier)
    if flt.pool is not None:
        q = q.where(Record.pool == flt.pool)
    q = q.order_by(Record.log_index).limit(limit + 1)
    with db.read() as s:
        rows = s.execute(q).all()
    items = [_stored(r) for r in rows[:limit]]
    more = len(rows) > limit
    return Page(items, encode_cursor(items[-1].log_index) if more and items else None)
