"""One-call cache lookups: a request in, vLLM's answer (or why there is none) out.

:func:`answer` keys the request under a fingerprint (``ck1``, the fingerprint's chat template
read from its log entry), finds the earliest reusable record under the key as
:mod:`ledger.storage.cache` does, and rebuilds the answer from it
(:mod:`ledger.cache_answer`). A miss says why: ``not_deterministic`` (the request's own
sampling: never looked up), ``no_record``, ``fingerprint_changed`` (the same request was
answered under another registered fingerprint, named in the message), ``not_reusable``
(records have the key, none at tier >= 1 with deterministic sampling and complete) or
``not_servable`` (the record cannot be rebuilt as this request's answer, e.g. per-token
logprob strings).

Fast, and still derived from the log: a process keeps the last verified answers by key
(:class:`HotAnswers`), each with the index rows it was verified through: the key's
reusable-marked rows, in log order, up to the record served. Every lookup reads those rows
again (one index query); the kept answer is served only when they are unchanged, so a new
index row before it, an edited row or an erasure (which deletes the key's rows) sends the
lookup back through the full check against the log. A fingerprint's chat template digest is
kept once read (a fingerprint ID is the digest of its body, checked when read).

A pool named instead of a fingerprint resolves to the fingerprint its live workers serve
(:func:`pool_fingerprint`: each worker's signed heartbeat re-verified), the one most of them
serve when they differ; the resolution is kept for one second.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.cache_answer import not_servable, response
from ledger.cachekey import CHAT, COMPLETIONS, cache_key, is_deterministic
from ledger.errors import Conflict, InvalidInput
from ledger.storage import workers
from ledger.storage.cache import (
    CHUNK,
    Found,
    chat_template_digest,
    find_reusable,
    fingerprint_body,
    miss_message,
)
from ledger.storage.database import Database
from ledger.storage.models import CacheKey, Fingerprint
from ledger.storage.queries import StoredRecord

# Other registered fingerprints a miss checks for the same request (newest first).
_SIBLINGS = 64


@dataclass(frozen=True)
class Answer:
    """A lookup's outcome: ``record`` and ``response`` on a hit, ``reason`` and ``message`` on a
    miss. ``key`` is None only when the request was not keyed (not deterministic)."""

    key: str | None
    fingerprint_id: str
    record: StoredRecord | None = None
    response: dict[str, Any] | None = None
    reason: str | None = None
    message: str | None = None

    @property
    def hit(self) -> bool:
        return self.record is not None


class HotAnswers:
    """The last verified answers by key, each with the rows it was verified through (LRU)."""

    def __init__(self, size: int = 8192) -> None:
        self._size = size
        self._items: OrderedDict[str, Found] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Found | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: str, found: Found) -> None:
        with self._lock:
            self._items[key] = found
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


_TEMPLATES: dict[str, str | None] = {}
_TEMPLATES_MAX = 4096


def _template(session: Session, fingerprint_id: str) -> str | None:
    """The fingerprint's chat template digest (NotFound when it is not registered)."""
    if fingerprint_id not in _TEMPLATES:
        digest = chat_template_digest(fingerprint_body(session, fingerprint_id))
        if len(_TEMPLATES) >= _TEMPLATES_MAX:
            _TEMPLATES.clear()
        _TEMPLATES[fingerprint_id] = digest
    return _TEMPLATES[fingerprint_id]


def _key(
    session: Session,
    endpoint: str,
    request: dict[str, Any],
    fingerprint_id: str,
    prompt_token_ids: list[int] | None,
) -> str:
    return cache_key(
        endpoint,
        request,
        fingerprint_id,
        prompt_token_ids=prompt_token_ids,
        chat_template=_template(session, fingerprint_id),  # NotFound: not registered
    )


def _reusable_rows(session: Session, key: str, limit: int) -> tuple[tuple[int, str], ...]:
    rows = session.execute(
        select(CacheKey.log_index, CacheKey.request_id)
        .where(CacheKey.cache_key == key, CacheKey.tier >= 1, CacheKey.deterministic)
        .order_by(CacheKey.log_index, CacheKey.request_id)
        .limit(limit)
    ).all()
    return tuple((r.log_index, r.request_id) for r in rows)


def _found(session: Session, key: str, hot: HotAnswers) -> Found:
    kept = hot.get(key)
    if (
        kept is not None
        and len(kept.marked) <= CHUNK
        and _reusable_rows(session, key, len(kept.marked)) == kept.marked
    ):
        return kept
    found = find_reusable(session, key)
    if found.hit is not None:
        hot.put(key, found)
    return found


def _answered_elsewhere(
    session: Session,
    endpoint: str,
    request: dict[str, Any],
    fingerprint_id: str,
    prompt_token_ids: list[int] | None,
) -> str | None:
    """Another registered fingerprint under which this request has a reusable record."""
    others = session.scalars(
        select(Fingerprint.fingerprint_id)
        .where(Fingerprint.fingerprint_id != fingerprint_id)
        .order_by(Fingerprint.log_index.desc())
        .limit(_SIBLINGS)
    ).all()
    keys = {_key(session, endpoint, request, other, prompt_token_ids): other for other in others}
    if not keys:
        return None
    found = session.scalars(
        select(CacheKey.cache_key)
        .where(CacheKey.cache_key.in_(keys), CacheKey.tier >= 1, CacheKey.deterministic)
        .distinct()
    ).all()
    for key in sorted(found, key=lambda k: others.index(keys[k])):  # the newest first
        if find_reusable(session, key).hit is not None:
            return keys[key]
    return None


def answer(
    db: Database,
    endpoint: str,
    request: dict[str, Any],
    fingerprint_id: str,
    *,
    prompt_token_ids: list[int] | None = None,
    hot: HotAnswers,
) -> Answer:
    """The recorded answer to ``request`` under ``fingerprint_id``, or why there is none.
    NotFound: the fingerprint is not registered; IndexMismatch: the index disagrees with the
    log (never an answer); InvalidInput: a request that cannot be keyed."""
    if endpoint not in (COMPLETIONS, CHAT):
        raise InvalidInput(f"endpoint must be {COMPLETIONS} or {CHAT}", code="invalid_request")
    if not isinstance(request, Mapping):
        raise InvalidInput("the request must be a JSON object", code="invalid_request")
    with db.read() as s:
        key = _key(s, endpoint, request, fingerprint_id, prompt_token_ids)
        if not is_deterministic(request):
            return Answer(
                key,
                fingerprint_id,
                reason="not_deterministic",
                message="the request samples at temperature > 0 without a seed (vLLM's default "
                "temperature is 1): its output is not reproducible, so never a cache answer",
            )
        found = _found(s, key, hot)
        if found.hit is None and not found.rows:
            other = _answered_elsewhere(s, endpoint, request, fingerprint_id, prompt_token_ids)
            if other is not None:
                return Answer(
                    key,
                    fingerprint_id,
                    reason="fingerprint_changed",
                    message=f"this request was answered under fingerprint {other}, not "
                    f"{fingerprint_id}: a new environment is a new contract",
                )
    if found.hit is None:
        if found.rows:
            return Answer(key, fingerprint_id, reason="not_reusable", message=miss_message(found))
        return Answer(
            key, fingerprint_id, reason="no_record", message="no record has this cache key"
        )
    record = found.hit.record
    why = not_servable(endpoint, request, record)
    if why is not None:
        return Answer(key, fingerprint_id, reason="not_servable", message=why)
    return Answer(key, fingerprint_id, found.hit, response(endpoint, request, record))


@dataclass(frozen=True)
class PoolContract:
    """The fingerprint a pool's lookups key under, and every one its live workers serve."""

    pool: str
    fingerprint_id: str
    fingerprint_ids: tuple[str, ...]


class PoolContracts:
    """Pools resolved to fingerprints from their live workers, each kept ``seconds``."""

    def __init__(self, seconds: float = 1.0) -> None:
        self._seconds = seconds
        self._items: dict[str, tuple[float, PoolContract]] = {}
        self._lock = threading.Lock()

    def resolve(self, db: Database, pool: str, ttl: float) -> PoolContract:
        """NotFound ``pool_not_found``; Conflict ``no_live_worker``."""
        now = time.monotonic()
        with self._lock:
            kept = self._items.get(pool)
        if kept is not None and now - kept[0] < self._seconds:
            return kept[1]
        contract = pool_fingerprint(db, pool, ttl)
        with self._lock:
            if len(self._items) >= 1024:
                self._items.clear()
            self._items[pool] = (now, contract)
        return contract


def pool_fingerprint(db: Database, pool: str, ttl: float) -> PoolContract:
    """The fingerprint most of the pool's live workers serve (ties: the lowest ID)."""
    live = workers.get_pool(db, pool, ttl).live
    if not live:
        raise Conflict(f"pool {pool!r} has no live worker", code="no_live_worker")
    counts = Counter(w.fingerprint_id for w in live)
    chosen = min(counts, key=lambda fp: (-counts[fp], fp))
    return PoolContract(pool, chosen, tuple(sorted(counts)))
