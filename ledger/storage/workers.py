"""Workers and pools: collectors register and heartbeat; a worker is live while it beats.

A worker row is live state (updated by each heartbeat), not a ledger table. What a worker
serves is named by its fingerprint ID, which the log holds; the row only says where to reach
it (its collector's URL) and which collector key signs what it returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import select

from ledger.errors import InvalidInput, NotFound
from ledger.storage import keystore
from ledger.storage.database import Database, as_utc, utcnow
from ledger.storage.models import Fingerprint, Worker

INVARIANCE_MODES = ("kernel", "serial", "none")
_NAME = re.compile(r"^[A-Za-z0-9._\-]{1,100}$")


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    pool: str
    url: str
    fingerprint_id: str
    batch_invariance: str
    key_id: str
    registered_at: datetime
    last_seen: datetime
    live: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "pool": self.pool,
            "url": self.url,
            "fingerprint_id": self.fingerprint_id,
            "batch_invariance": self.batch_invariance,
            "key_id": self.key_id,
            "registered_at": self.registered_at.isoformat(),
            "last_seen": self.last_seen.isoformat(),
            "live": self.live,
        }


@dataclass(frozen=True)
class Pool:
    name: str
    workers: list[WorkerInfo]

    @property
    def live(self) -> list[WorkerInfo]:
        return [w for w in self.workers if w.live]

    def to_dict(self) -> dict[str, Any]:
        live = self.live
        return {
            "pool": self.name,
            "fingerprint_ids": sorted({w.fingerprint_id for w in live}),
            "batch_invariance": sorted({w.batch_invariance for w in live}),
            "live_workers": len(live),
            "workers": [w.to_dict() for w in self.workers],
        }


def _check(data: Any) -> dict[str, str]:
    if not isinstance(data, dict):
        raise InvalidInput("a worker registration must be a JSON object", code="schema_violation")
    fields = ("worker_id", "pool", "url", "fingerprint_id", "batch_invariance", "key_id")
    missing = [f for f in fields if not isinstance(data.get(f), str) or not data[f]]
    if missing:
        raise InvalidInput(f"worker registration lacks {missing}", code="schema_violation")
    extra = set(data) - set(fields)
    if extra:
        raise InvalidInput(f"unknown members {sorted(extra)}", code="schema_violation")
    for name in ("worker_id", "pool"):
        if not _NAME.fullmatch(data[name]):
            raise InvalidInput(f"{name} must be 1-100 of [A-Za-z0-9._-]", code="schema_violation")
    url = urlsplit(data["url"])
    if url.scheme not in ("http", "https") or not url.netloc or len(data["url"]) > 500:
        raise InvalidInput(f"url {data['url']!r} is not an http(s) URL", code="invalid_url")
    if data["batch_invariance"] not in INVARIANCE_MODES:
        raise InvalidInput(
            f"batch_invariance must be one of {list(INVARIANCE_MODES)}", code="schema_violation"
        )
    return {f: data[f] for f in fields}


def heartbeat(db: Database, data: Any) -> WorkerInfo:
    """Register a worker or refresh it (the same call); the fingerprint must be registered."""
    item = _check(data)
    with db.write() as s:
        if s.get(Fingerprint, item["fingerprint_id"]) is None:
            raise InvalidInput(
                f"fingerprint {item['fingerprint_id']} is not registered: register it first",
                code="unknown_fingerprint",
            )
        keys = keystore.load_keys(s, [item["key_id"]])
        key = keys.get(item["key_id"])
        if key is None or key.revoked or key.role != "collector":
            raise InvalidInput(
                f"key {item['key_id']} is not a registered, unrevoked collector key",
                code="unknown_key",
            )
        now = utcnow()
        row = s.get(Worker, item["worker_id"])
        if row is None:
            row = Worker(**item, registered_at=now, last_seen=now)
            s.add(row)
        else:
            for name, value in item.items():
                setattr(row, name, value)
            row.last_seen = now
        s.flush()
        return _info(row, now, timedelta(seconds=1))


def _info(row: Worker, now: datetime, ttl: timedelta) -> WorkerInfo:
    seen = as_utc(row.last_seen)
    return WorkerInfo(
        worker_id=row.worker_id,
        pool=row.pool,
        url=row.url,
        fingerprint_id=row.fingerprint_id,
        batch_invariance=row.batch_invariance,
        key_id=row.key_id,
        registered_at=as_utc(row.registered_at),
        last_seen=seen,
        live=now - seen <= ttl,
    )


def list_workers(db: Database, ttl: float, pool: str | None = None) -> list[WorkerInfo]:
    q = select(Worker).order_by(Worker.pool, Worker.worker_id)
    if pool is not None:
        q = q.where(Worker.pool == pool)
    now = utcnow()
    with db.read() as s:
        return [_info(r, now, timedelta(seconds=ttl)) for r in s.execute(q).scalars()]


def pools(db: Database, ttl: float) -> list[Pool]:
    grouped: dict[str, list[WorkerInfo]] = {}
    for w in list_workers(db, ttl):
        grouped.setdefault(w.pool, []).append(w)
    return [Pool(name, ws) for name, ws in sorted(grouped.items())]


def get_pool(db: Database, name: str, ttl: float) -> Pool:
    workers = list_workers(db, ttl, name)
    if not workers:
        raise NotFound(f"no pool {name!r}: no worker has registered in it", code="pool_not_found")
    return Pool(name, workers)
