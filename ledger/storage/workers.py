"""Workers and pools: collectors register and heartbeat with signed heartbeats.

A worker row is live state (each heartbeat replaces it), not a ledger table, so nothing it
holds is served on its own word:

- the row keeps the last accepted heartbeat envelope (``ledger.heartbeat``), signed by the
  collector key; every read checks it against the key registry (its signature once per
  process) and compares it with the row, so an edited row (URL, key, pool, fingerprint) or a
  revoked key makes the worker not live, with the reason in ``problem``;
- a collector key holds at most ``LEDGER_MAX_WORKERS_PER_KEY`` worker IDs (409
  ``too_many_workers`` beyond), and its workers unseen for ``FORGET_AFTER`` are forgotten when
  it needs room;
- a ``worker_id`` belongs to the first key that registered it: a heartbeat signed by another
  key is 409 ``worker_conflict`` and changes nothing;
- a heartbeat must be newer than the last accepted one (``stale_heartbeat`` otherwise), so a
  captured heartbeat cannot roll a URL back;
- the worker's batch invariance is derived from the signed fingerprint it serves (its engine
  section, :func:`ledger.heartbeat.batch_invariance`), never claimed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from ledger.canonical import digest_of
from ledger.clock import rfc3339
from ledger.errors import Conflict, InvalidInput, LedgerError, NotFound
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.heartbeat import (
    HEARTBEAT_KIND,
    MAX_SKEW,
    batch_invariance,
    check_heartbeat,
    format_time,
    parse_time,
)
from ledger.key_scope import check_pool_name
from ledger.signing import Envelope
from ledger.storage import keystore
from ledger.storage.database import Database, as_utc, utcnow
from ledger.storage.models import Fingerprint, LogEntry, Worker
from ledger.worker_url import Resolver, UrlPolicy, check_worker_url, system_resolve

# Derived invariance per fingerprint ID: the ID is the digest of the body it was derived from
# (checked before caching), so an entry can never go stale.
_INVARIANCE: dict[str, str] = {}
_INVARIANCE_CACHE = 4096
# Stored heartbeats whose signature verified, by their canonical bytes: (envelope, the public
# key it verified under). Bounded: cleared when full.
_HEARTBEATS: dict[bytes, tuple[Envelope, str]] = {}
_HEARTBEAT_CACHE = 8192
# Worker IDs one collector key may hold by default (LEDGER_MAX_WORKERS_PER_KEY); a key at its
# limit registers a new one only after its workers unseen for FORGET_AFTER are forgotten
# (their IDs become free again).
MAX_WORKERS_PER_KEY = 1024
FORGET_AFTER = timedelta(days=1)


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    pool: str
    url: str
    fingerprint_id: str
    batch_invariance: str  # derived from the fingerprint body
    key_id: str  # the collector key the worker is bound to
    registered_at: datetime
    last_seen: datetime  # when the ledger accepted the last heartbeat
    heartbeat_issued_at: datetime  # when the collector signed it
    live: bool
    problem: str | None = None  # why the stored heartbeat cannot be trusted (then not live)
    spool_pending: int | None = None  # records its spool holds unacknowledged (signed; if said)

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "pool": self.pool,
            "url": self.url,
            "fingerprint_id": self.fingerprint_id,
            "batch_invariance": self.batch_invariance,
            "key_id": self.key_id,
            "registered_at": rfc3339(self.registered_at),
            "last_seen": rfc3339(self.last_seen),
            "heartbeat_issued_at": format_time(self.heartbeat_issued_at),
            "live": self.live,
            "problem": self.problem,
            "spool_pending": self.spool_pending,
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


def heartbeat(
    db: Database,
    data: Any,
    policy: UrlPolicy,
    resolve: Resolver = system_resolve,
    *,
    max_workers: int = MAX_WORKERS_PER_KEY,
) -> WorkerInfo:
    """Register a worker or refresh it (the same call) from a signed heartbeat envelope.

    Checks, in order: the envelope and body (``ledger.heartbeat``), the signer (registered,
    role collector, signature: no name is resolved for an envelope nobody registered signed),
    the URL and every address it resolves to (``ledger.worker_url``), the signer unrevoked, the
    fingerprint (registered), the owner (``worker_conflict``) and that the heartbeat is newer
    than the last one accepted (``stale_heartbeat``), as that one's signed body says."""
    env = Envelope.from_dict(data)
    if env.kind != HEARTBEAT_KIND:
        raise InvalidInput(
            f"expected an envelope of kind {HEARTBEAT_KIND!r}, got {env.kind!r}", code="wrong_kind"
        )
    beat = check_heartbeat(env.body, utcnow())
    with db.read() as s:
        keys = keystore.load_keys(s, [env.key_id])
    keystore.check_signer(env, keys)
    check_worker_url(beat.url, policy, resolve)
    with db.write() as s:
        keystore.require_unrevoked(s, [env.key_id])
        if s.get(Fingerprint, beat.fingerprint_id) is None:
            raise InvalidInput(
                f"fingerprint {beat.fingerprint_id} is not registered: register it first",
                code="unknown_fingerprint",
            )
        now = utcnow()
        row = s.get(Worker, beat.worker_id)
        if row is None:
            _make_room(s, env.key_id, now, max_workers)
            row = Worker(worker_id=beat.worker_id, key_id=env.key_id, registered_at=now)
            s.add(row)
        elif row.key_id != env.key_id:
            raise Conflict(
                f"worker {beat.worker_id!r} belongs to key {row.key_id}; a heartbeat signed by "
                f"{env.key_id} cannot take it over",
                code="worker_conflict",
                details={"worker_id": beat.worker_id, "key_id": row.key_id},
            )
        elif (last := _trusted_issued_at(row, keys)) is not None and beat.issued_at <= last:
            raise InvalidInput(
                f"this heartbeat (issued {format_time(beat.issued_at)}) is not newer than the "
                f"last one accepted for worker {beat.worker_id!r} ({format_time(last)})",
                code="stale_heartbeat",
            )
        row.pool, row.url, row.fingerprint_id = beat.pool, beat.url, beat.fingerprint_id
        row.heartbeat, row.heartbeat_issued_at, row.last_seen = env.canonical, beat.issued_at, now
        s.flush()
        invariance = _invariances(s, [beat.fingerprint_id])
        return _info(row, keys, invariance, now, timedelta(seconds=1))


def _make_room(s: Session, key_id: str, now: datetime, limit: int) -> None:
    """Let ``key_id`` register one more worker ID: forget its workers unseen for FORGET_AFTER
    when it holds ``limit``; 409 ``too_many_workers`` if it still does (every list, pool
    lookup and metrics scrape reads every worker row). Under the write lock: ledger
    processes take their turns."""
    held = select(func.count()).select_from(Worker).where(Worker.key_id == key_id)
    if (s.scalar(held) or 0) < limit:
        return
    s.execute(delete(Worker).where(Worker.key_id == key_id, Worker.last_seen < now - FORGET_AFTER))
    if (s.scalar(held) or 0) >= limit:
        raise Conflict(
            f"key {key_id} already holds {limit} worker IDs seen within the last day; reuse "
            "one (give each worker an ID it keeps across restarts: `ledger collect "
            "--worker-id`), raise LEDGER_MAX_WORKERS_PER_KEY, or register another collector key",
            code="too_many_workers",
            details={"key_id": key_id, "limit": limit},
        )


def _invariances(session: Session, fingerprint_ids: Iterable[str]) -> dict[str, str]:
    """Each fingerprint's derived batch invariance, from its logged envelope (``none`` when
    the envelope is missing or does not hash to its ID)."""
    wanted = set(fingerprint_ids)
    out = {fp: _INVARIANCE[fp] for fp in wanted if fp in _INVARIANCE}
    missing = sorted(wanted - set(out))
    if missing:
        rows = session.execute(
            select(Fingerprint.fingerprint_id, LogEntry.envelope)
            .join(LogEntry, LogEntry.idx == Fingerprint.log_index)
            .where(Fingerprint.fingerprint_id.in_(missing))
        ).all()
        for fp_id, envelope in rows:
            data = json.loads(envelope)
            if not isinstance(data, dict) or data.get("kind") != FINGERPRINT_KIND:
                continue
            body = data.get("body")
            if not isinstance(body, dict) or digest_of(body) != fp_id:
                continue  # an edited log entry: claim nothing (audit names it)
            out[fp_id] = batch_invariance(body)
            if len(_INVARIANCE) >= _INVARIANCE_CACHE:
                _INVARIANCE.clear()
            _INVARIANCE[fp_id] = out[fp_id]
    return {fp: out.get(fp, "none") for fp in wanted}


def fingerprint_invariance(db: Database, fingerprint_id: str) -> str:
    """The batch invariance the registered fingerprint implies (NotFound if not registered)."""
    with db.read() as s:
        if s.get(Fingerprint, fingerprint_id) is None:
            raise NotFound(f"no fingerprint {fingerprint_id}", code="fingerprint_not_found")
        return _invariances(s, [fingerprint_id])[fingerprint_id]


def _stored_heartbeat(row: Worker, keys: dict[str, keystore.KeyInfo]) -> tuple[Envelope, bool]:
    """The row's stored heartbeat and whether its signature was verified before under its
    key's current public key (every list and scrape reads every row: each stored heartbeat
    is parsed and its signature checked once per process, the registry's checks every time).
    ValueError or LedgerError if it is not an envelope."""
    data = bytes(row.heartbeat)
    key = keys.get(row.key_id)
    public = key.public_key if key is not None else None
    known = _HEARTBEATS.get(data)
    if known is not None and known[1] == public:
        return known[0], True
    return Envelope.from_dict(json.loads(data)), False


def _remember(row: Worker, env: Envelope, keys: dict[str, keystore.KeyInfo]) -> None:
    data = bytes(row.heartbeat)
    if len(_HEARTBEATS) >= _HEARTBEAT_CACHE:
        _HEARTBEATS.clear()
    _HEARTBEATS[data] = (env, keys[env.key_id].public_key)


def _problem(row: Worker, keys: dict[str, keystore.KeyInfo]) -> tuple[str | None, Any]:
    """Why the row's stored heartbeat cannot be trusted now (None: it can), and its body."""
    try:
        env, verified = _stored_heartbeat(row, keys)
    except (LedgerError, ValueError):
        return "the stored heartbeat is not an envelope", None
    body = env.body
    signed = (body.get("worker_id"), body.get("pool"), body.get("url"), body.get("fingerprint_id"))
    if signed != (row.worker_id, row.pool, row.url, row.fingerprint_id) or env.key_id != row.key_id:
        return "the worker row disagrees with its signed heartbeat", None
    issued = _issued_at(body)
    # the ledger accepted the heartbeat within MAX_SKEW of the time it was signed
    if issued is None or as_utc(row.heartbeat_issued_at) != issued:
        return "the worker row's heartbeat time disagrees with its signed heartbeat", None
    if abs(as_utc(row.last_seen) - issued) > MAX_SKEW:
        return "the worker row's last_seen is not when its signed heartbeat was issued", None
    if env.kind != HEARTBEAT_KIND:
        return f"the stored heartbeat is a {env.kind!r}", None
    try:
        keystore.check_signer(env, keys, signature_verified=verified)
    except LedgerError as exc:
        return f"{exc.code}: {exc.message}", None
    if not verified:
        _remember(row, env, keys)
    return None, body


def _issued_at(body: Any) -> datetime | None:
    try:
        return parse_time(body["issued_at"])
    except (LedgerError, KeyError, TypeError):
        return None


def _trusted_issued_at(row: Worker, keys: dict[str, keystore.KeyInfo]) -> datetime | None:
    """When the worker's stored heartbeat was signed, if it can be trusted (None: it cannot,
    and a heartbeat signed by the worker's key replaces it)."""
    problem, body = _problem(row, keys)
    return None if problem is not None else _issued_at(body)


def _info(
    row: Worker,
    keys: dict[str, keystore.KeyInfo],
    invariance: dict[str, str],
    now: datetime,
    ttl: timedelta,
) -> WorkerInfo:
    seen = as_utc(row.last_seen)
    problem, body = _problem(row, keys)
    issued = _issued_at(body) if problem is None else None
    pending = body.get("spool_pending") if body is not None else None
    return WorkerInfo(
        worker_id=row.worker_id,
        pool=row.pool,
        url=row.url,
        fingerprint_id=row.fingerprint_id,
        batch_invariance=invariance.get(row.fingerprint_id, "none") if problem is None else "none",
        key_id=row.key_id,
        registered_at=as_utc(row.registered_at),
        last_seen=seen,
        heartbeat_issued_at=as_utc(row.heartbeat_issued_at),
        # a heartbeat is live for ttl after the ledger took it, and never longer after it was
        # signed than ttl and the clock skew a heartbeat may have (row times are not signed)
        live=issued is not None and now - seen <= ttl and now - issued <= ttl + MAX_SKEW,
        problem=problem,
        spool_pending=pending if type(pending) is int else None,
    )


def list_workers(db: Database, ttl: float, pool: str | None = None) -> list[WorkerInfo]:
    q = select(Worker).order_by(Worker.pool, Worker.worker_id)
    if pool is not None:
        q = q.where(Worker.pool == check_pool_name(pool))
    now = utcnow()
    with db.read() as s:
        rows = list(s.execute(q).scalars())
        keys = keystore.load_keys(s, [r.key_id for r in rows])
        invariance = _invariances(s, [r.fingerprint_id for r in rows])
    return [_info(r, keys, invariance, now, timedelta(seconds=ttl)) for r in rows]


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
