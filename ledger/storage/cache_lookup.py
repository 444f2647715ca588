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
(:class:`HotAnswers`), each with the index rows it was verified through: the key's first 17
rows in log order, which hold the record served (or all of them; a lookup by pool whose
answer lies beyond them is not kept). Every lookup reads those
rows again (one prepared index read, :mod:`ledger.storage.cache_rows`); the kept answer is
served only when they are unchanged, so a new row, an edited row or an erasure (which deletes
the key's rows) sends the lookup back through the full check against the log
(:func:`kept_answer` is that check for the event loop: ``api/cache_fast.py``). On Postgres a
key's first lookup reads its rows with their log entries, stored disclosures and erasure state
in one statement (one snapshot) and verifies them as :func:`find_reusable` does
(``cache_rows.found_among``); anything it cannot decide goes to the full check. A
fingerprint's chat template digest is kept once read (a fingerprint ID is the digest of its
body, checked when read).

A pool named instead of a fingerprint resolves to the fingerprint its live workers serve
(:func:`pool_fingerprint`: each worker's signed heartbeat re-verified), the one most of them
serve when they differ; the resolution is kept for one second. A lookup by pool answers only
with a record of that pool (signed by a key that may sign for it, ``ledger.key_scope``): what a
record says of its environment is its signer's word, so another pool's compromised collector
claiming this pool's fingerprint reaches no lookup by this pool. Its answers are kept apart
from the fingerprint's (:func:`_hot_key`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import select

from ledger.cache_answer import not_servable, response
from ledger.cachekey import CHAT, COMPLETIONS, cache_key, samples_at_random
from ledger.canonical import digest_of
from ledger.errors import Conflict, InvalidInput
from ledger.storage import workers
from ledger.storage.cache import (
    Found,
    chat_template_digest,
    find_reusable,
    fingerprint_body,
    miss_message,
)
from ledger.storage.cache_rows import ROWS_LIMIT, AsyncRows, NotRead, Rows, found_among, read_rows
from ledger.storage.database import Database
from ledger.storage.models import CacheKey, Fingerprint
from ledger.storage.queries import StoredRecord

logger = logging.getLogger("ledger.storage")

# Other registered fingerprints a miss checks for the same request (newest first).
_SIBLINGS = 64


@dataclass(frozen=True)
class Answer:
    """A lookup's outcome under ``key``: ``record`` and ``response`` on a hit, ``reason`` and
    ``message`` on a miss."""

    key: str
    fingerprint_id: str
    record: StoredRecord | None = None
    response: dict[str, Any] | None = None
    reason: str | None = None
    message: str | None = None
    # How it was reached: "log" (the full check against the log), "kept" (verified before,
    # the key's index rows unchanged since), "first" (verified from the key's rows read in
    # one statement with their log entries) or "request" (the request alone: not looked up).
    via: str = "log"

    @property
    def hit(self) -> bool:
        return self.record is not None

    @property
    def outcome(self) -> str:
        return "hit" if self.record is not None else str(self.reason)


@dataclass(frozen=True)
class _Kept:
    rows: Rows  # the key's index rows the answer was verified through, as read then
    found: Found


_E = TypeVar("_E")


# What a kept answer costs in memory, estimated from what it holds: its record's envelope and
# stored disclosures, the body and typed record they parse into (packed arrays stay packed:
# 2 to 3.5 times the stored bytes in all, measured), with the rows and the entry itself.
# tests/ledger/test_hot_answers.py checks that the estimate exceeds what tracemalloc measures
# of a kept answer once served, for records of every shape.
_EXPANSION = 5
_OVERHEAD = 6 * 1024
_PER_ROW = 512


def kept_bytes(kept: _Kept) -> int:
    """The memory a kept answer is charged (an upper estimate, see ``_EXPANSION``)."""
    size = _OVERHEAD + _PER_ROW * len(kept.rows)
    hit = kept.found.hit
    if hit is not None:
        size += _EXPANSION * (len(hit.envelope) + sum(len(d) for d in hit.disclosures))
    return size


class HotAnswers:
    """The last verified answers by key, each with the rows it was verified through, least
    recently used out once they are charged more than ``max_bytes`` (:func:`kept_bytes`; an
    answer charged more than that alone is not kept)."""

    def __init__(
        self,
        max_bytes: int = 128 * 1024 * 1024,
        on_change: Callable[[int, int], None] | None = None,
    ) -> None:
        self._max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[_Kept, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        # Told (bytes charged, answers kept) at the start and after each change, under the
        # lock, so in order: the API's gauges of how full the kept answers are.
        self._on_change = on_change
        self._changed()
        # Counts erasures forgotten: an answer verified before one (it may hold content
        # erased since) is not kept after it.
        self._erasures = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        """What the kept answers are charged, in all (at most ``max_bytes``)."""
        return self._bytes

    @property
    def generation(self) -> int:
        """Take this before verifying an answer, and pass it to :meth:`put`."""
        return self._erasures

    def get(self, key: str) -> _Kept | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: str, kept: _Kept, generation: int) -> None:
        """Keep an answer verified since ``generation``, unless an erasure was forgotten
        meanwhile (the answer may hold what it erased, and its forget has run)."""
        with self._lock:
            if generation != self._erasures:
                return
            removed = self._remove(key)
            size = kept_bytes(kept)
            if size > self._max_bytes:
                if removed:
                    self._changed()
                return
            self._items[key] = (kept, size)
            self._bytes += size
            while self._bytes > self._max_bytes:
                _, (_, evicted) = self._items.popitem(last=False)
                self._bytes -= evicted
            self._changed()

    def _remove(self, key: str) -> bool:
        item = self._items.pop(key, None)
        if item is not None:
            self._bytes -= item[1]
        return item is not None

    def _changed(self) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(self._bytes, len(self._items))
        except Exception:  # a gauge never fails a lookup or an erasure
            logger.exception("reporting the kept cache answers failed")

    def drop(self, key: str) -> None:
        """Forget a key whose rows changed: what it kept may be content erased since."""
        with self._lock:
            if self._remove(key):
                self._changed()

    def clear(self) -> None:
        """Forget every answer (an erasure that failed part way: which records it erased
        before failing is not known here)."""
        with self._lock:
            self._erasures += 1
            self._items.clear()
            self._bytes = 0
            self._changed()

    def after_erasure(self, erase: Callable[[], _E], erased: Callable[[_E], Collection[str]]) -> _E:
        """Run an erasure and forget the answers it made stale: those of the records it
        ``erased``, or every answer when it fails part way (batches before the failure were
        erased, and which ones is not known here)."""
        try:
            result = erase()
        except BaseException:
            self.clear()
            raise
        self.forget(erased(result))
        return result

    def forget(self, request_ids: Collection[str]) -> None:
        """Forget every answer that is one of these records (their content was erased): a
        kept answer is never served once its rows change, but it holds the content."""
        if not request_ids:
            return
        with self._lock:
            self._erasures += 1
            gone = [
                key
                for key, (kept, _) in self._items.items()
                if kept.found.hit is not None and kept.found.hit.request_id in request_ids
            ]
            for key in gone:
                self._remove(key)
            if gone:
                self._changed()


@dataclass(frozen=True)
class _Facts:
    """What a lookup needs of a registered fingerprint, read once from its log entry."""

    chat_template: str | None
    model: str  # the digest of its model section: fingerprints of one model share it
    # Why no chat answer of this environment is served (None: they may be): the engine runs
    # a --reasoning-parser, or the chat template reads the date.
    chat_unservable: str | None = None


def _chat_unservable(body: Mapping[str, Any]) -> str | None:
    """Why a fingerprint's chat answers are not served from the cache (None: they may be)."""
    engine, model = body.get("engine"), body.get("model")
    parser = engine.get("reasoning_parser") if isinstance(engine, dict) else None
    if parser not in (None, "default", ""):
        return (
            "the engine runs a reasoning parser (its fingerprint's engine.reasoning_parser): "
            "the record holds the answer's content, not the reasoning vLLM returns beside it"
        )
    template = model.get("chat_template") if isinstance(model, dict) else None
    if isinstance(template, dict) and template.get("reads_clock") is True:
        return (
            "the chat template reads the date (model.chat_template.reads_clock): it renders "
            "another prompt on another day than the record's"
        )
    return None


class _Fingerprints:
    """Registered fingerprints' facts (a fingerprint ID is the digest of its body, checked
    when read, so facts never go stale), and each database's list of registered IDs, re-read
    when older than ``seconds`` or without the fingerprint asked about (for the other
    environments of a model, :func:`_answered_elsewhere`)."""

    def __init__(self, seconds: float = 5.0) -> None:
        self._seconds = seconds
        self._facts: dict[str, _Facts] = {}
        self._ids: dict[str, tuple[float, list[str]]] = {}  # by database URL
        self._lock = threading.Lock()

    def facts(self, db: Database, fingerprint_id: str) -> _Facts:
        """NotFound when the fingerprint is not registered."""
        facts = self._facts.get(fingerprint_id)
        if facts is None:
            with db.read() as s:
                body = fingerprint_body(s, fingerprint_id)
            facts = _Facts(
                chat_template_digest(body), digest_of(body.get("model")), _chat_unservable(body)
            )
            with self._lock:
                if len(self._facts) >= 4096:
                    self._facts.clear()
                self._facts[fingerprint_id] = facts
        return facts

    def known(self, fingerprint_id: str) -> _Facts | None:
        """The facts when already read (no database access)."""
        return self._facts.get(fingerprint_id)

    def _fresh_ids(self, db: Database, fingerprint_id: str) -> list[str] | None:
        at, ids = self._ids.get(db.url, (-1e9, []))
        fresh = time.monotonic() - at <= self._seconds and fingerprint_id in ids
        return ids if fresh else None

    def _same_model(self, ids: list[str], fingerprint_id: str) -> list[str]:
        """The IDs (their facts read) of ``fingerprint_id``'s model but itself, at most 64."""
        model = self._facts[fingerprint_id].model
        same = [fp for fp in ids if fp != fingerprint_id and self._facts[fp].model == model]
        return same[:_SIBLINGS]

    def known_siblings(self, db: Database, fingerprint_id: str) -> list[str] | None:
        """:meth:`siblings` when the list is fresh and every fact known (None otherwise)."""
        ids = self._fresh_ids(db, fingerprint_id)
        if ids is None or any(fp not in self._facts for fp in ids):
            return None
        return self._same_model(ids, fingerprint_id)

    def siblings(self, db: Database, fingerprint_id: str) -> list[str]:
        """Other registered fingerprints of the same model, newest first (at most 64)."""
        ids = self._fresh_ids(db, fingerprint_id)
        if ids is None:
            with db.read() as s:
                ids = list(
                    s.scalars(
                        select(Fingerprint.fingerprint_id)
                        .order_by(Fingerprint.log_index.desc())
                        .limit(1024)
                    )
                )
            with self._lock:
                self._ids[db.url] = (time.monotonic(), ids)
        for fp in (fingerprint_id, *ids):
            self.facts(db, fp)  # each read once
        return self._same_model(ids, fingerprint_id)


_FINGERPRINTS = _Fingerprints()


def _known_template(fingerprint_id: str) -> str | None:
    facts = _FINGERPRINTS.known(fingerprint_id)
    if facts is None:
        raise NotRead(fingerprint_id)
    return facts.chat_template


def _key(
    db: Database,
    endpoint: str,
    request: Mapping[str, Any],
    fingerprint_id: str,
    prompt_token_ids: list[int] | None,
) -> str:
    return cache_key(
        endpoint,
        dict(request),
        fingerprint_id,
        prompt_token_ids=prompt_token_ids,
        chat_template=_FINGERPRINTS.facts(db, fingerprint_id).chat_template,
    )


def _hot_key(key: str, pool: str | None) -> str:
    """Where an answer is kept: by key, and by pool for a lookup by pool (its answer may be a
    later record of the key)."""
    return key if pool is None else f"{key} {pool}"


def _found(db: Database, key: str, hot: HotAnswers, pool: str | None) -> tuple[Found, Rows]:
    """The key's answer: the kept one while the key's index rows are those it was verified
    through, else verified afresh against the log (and kept when the rows did not change
    meanwhile and its answer lies within them)."""
    generation = hot.generation
    rows = read_rows(db, key)
    kept = hot.get(_hot_key(key, pool))
    if kept is not None and kept.rows == rows:
        return kept.found, rows
    if kept is not None:
        hot.drop(_hot_key(key, pool))
    if not rows:
        return Found(None, (), 0, frozenset()), rows
    with db.read() as s:
        found = find_reusable(s, key, pool)
    # Kept only when the rows read cover it: all of the key's rows, or those up to its hit.
    hit = found.hit
    within = len(rows) < ROWS_LIMIT or (
        hit is not None and any((i, r) == (hit.log_index, hit.request_id) for i, r, _, _ in rows)
    )
    if within and read_rows(db, key) == rows:
        hot.put(_hot_key(key, pool), _Kept(rows, found), generation)
    return found, rows


def _answered_elsewhere(
    db: Database,
    endpoint: str,
    request: Mapping[str, Any],
    fingerprint_id: str,
    prompt_token_ids: list[int] | None,
) -> str | None:
    """Another environment of the same model (a registered fingerprint whose model section is
    this one's) under which this request has a reusable record of any pool, re-derived from
    the log: it only names that fingerprint in a miss, it never answers."""
    others = _FINGERPRINTS.siblings(db, fingerprint_id)
    if not others:
        return None
    keys = {_key(db, endpoint, request, other, prompt_token_ids): other for other in others}
    with db.read() as s:
        found = s.scalars(
            select(CacheKey.cache_key)
            .where(CacheKey.cache_key.in_(keys), CacheKey.tier >= 1, CacheKey.deterministic)
            .distinct()
        ).all()
        for key in sorted(found, key=lambda k: others.index(keys[k])):  # the newest first
            if find_reusable(s, key).hit is not None:
                return keys[key]
    return None


def _not_deterministic(key: str, fingerprint_id: str) -> Answer:
    return Answer(
        key,
        fingerprint_id,
        via="request",
        reason="not_deterministic",
        message="the request samples at temperature > 0 without a seed (vLLM's default "
        "temperature is 1; seed -1 is none): its output is not reproducible, so never a cache "
        "answer",
    )


def _no_record(key: str, fingerprint_id: str, via: str = "log") -> Answer:
    return Answer(
        key, fingerprint_id, reason="no_record", message="no record has this cache key", via=via
    )


async def kept_answer(
    reader: AsyncRows,
    hot: HotAnswers,
    endpoint: str,
    request: dict[str, Any],
    fingerprint_id: str,
    *,
    prompt_token_ids: list[int] | None = None,
    pool: str | None = None,
) -> Answer | None:
    """The kept answer to ``request``, checked against the key's index rows read now, or on
    a key's first lookup (Postgres) its answer verified from the rows read with their log
    entries; None whenever :func:`answer` must decide (rows changed, a row that does not
    agree with its entry, no reusable record among the first rows, a fingerprint not read yet,
    a request that cannot be keyed or served from the record)."""
    facts = _FINGERPRINTS.known(fingerprint_id)
    if facts is None or endpoint not in (COMPLETIONS, CHAT):
        return None
    try:
        key = cache_key(
            endpoint,
            request,
            fingerprint_id,
            prompt_token_ids=prompt_token_ids,
            chat_template=facts.chat_template,
        )
    except InvalidInput:
        return None
    if samples_at_random(request):
        return _not_deterministic(key, fingerprint_id)
    generation = hot.generation
    kept = hot.get(_hot_key(key, pool))
    if kept is not None:
        if kept.found.hit is None or await reader.rows(key) != kept.rows:
            return None  # the slow path reads the rows again, and drops or replaces it
        hit, via = kept.found.hit, "kept"
    else:
        candidates = await reader.candidates(key)
        if not candidates:
            # A key with no row is a miss, unless another environment of the model answered
            # it (the route looks there): answered here only when the model has no other.
            if _FINGERPRINTS.known_siblings(reader.db, fingerprint_id) != []:
                return None
            if candidates is None and await reader.rows(key):  # SQLite: the rows read now
                return None
            return _no_record(key, fingerprint_id, via="first")
        found = found_among(key, candidates, _known_template, pool)
        if found is None or found.hit is None:
            return None
        kept_rows = tuple(c.row for c in candidates)
        hot.put(_hot_key(key, pool), _Kept(kept_rows, found), generation)  # hit within
        hit, via = found.hit, "first"
    if not_servable(endpoint, request, hit.record, facts.chat_unservable) is not None:
        return None
    return Answer(key, fingerprint_id, hit, response(endpoint, request, hit.record), via=via)


def answer(
    db: Database,
    endpoint: str,
    request: dict[str, Any],
    fingerprint_id: str,
    *,
    prompt_token_ids: list[int] | None = None,
    hot: HotAnswers,
    pool: str | None = None,
) -> Answer:
    """The recorded answer to ``request`` under ``fingerprint_id`` (with ``pool``: recorded
    in that pool), or why there is none.
    NotFound: the fingerprint is not registered; IndexMismatch: the index disagrees with the
    log (never an answer); InvalidInput: a request that cannot be keyed."""
    if endpoint not in (COMPLETIONS, CHAT):
        raise InvalidInput(f"endpoint must be {COMPLETIONS} or {CHAT}", code="invalid_request")
    if not isinstance(request, Mapping):
        raise InvalidInput("the request must be a JSON object", code="invalid_request")
    key = _key(db, endpoint, request, fingerprint_id, prompt_token_ids)
    if samples_at_random(request):
        return _not_deterministic(key, fingerprint_id)
    found, rows = _found(db, key, hot, pool)
    if not rows:
        other = _answered_elsewhere(db, endpoint, request, fingerprint_id, prompt_token_ids)
        if other is not None:
            return Answer(
                key,
                fingerprint_id,
                reason="fingerprint_changed",
                message=f"this request was answered under fingerprint {other}, another "
                f"environment of the same model, not under {fingerprint_id}: a new "
                "environment is a new contract",
            )
    if found.hit is None:
        if found.rows:
            return Answer(key, fingerprint_id, reason="not_reusable", message=miss_message(found))
        if pool is not None and rows:
            return Answer(
                key,
                fingerprint_id,
                reason="no_record",
                message=f"no record of pool {pool!r} has this cache key; records of other pools "
                "do (a lookup by fingerprint_id considers them)",
            )
        return _no_record(key, fingerprint_id)
    record = found.hit.record
    unservable = _FINGERPRINTS.facts(db, fingerprint_id).chat_unservable
    why = not_servable(endpoint, request, record, unservable)
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

    def kept(self, pool: str) -> PoolContract | None:
        """The pool's resolution while it is fresh (no database access)."""
        with self._lock:
            kept = self._items.get(pool)
        if kept is not None and time.monotonic() - kept[0] < self._seconds:
            return kept[1]
        return None

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
