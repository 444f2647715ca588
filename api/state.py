"""What the app holds: the database, the ledger key, the settings, the metrics."""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

import httpx
from fastapi import Depends, Request

from api.metrics import Metrics
from api.settings import Settings
from api.workers_client import new_client
from ledger.errors import Pushback
from ledger.signing import SigningKey
from ledger.storage.cache_lookup import AsyncRows, HotAnswers, PoolContracts
from ledger.storage.database import Database
from ledger.tokens import Principal


class TokenCache:
    """Verified tokens, trusted for ``ttl`` seconds (a revocation takes effect within it),
    never past the token's own expiry: an expired entry is dropped, so the next lookup in the
    database refuses the token (``token_expired``)."""

    def __init__(self, ttl: float, size: int = 1024) -> None:
        self.ttl, self.size = ttl, size
        self._items: dict[str, tuple[float, Principal]] = {}

    def get(self, secret: str) -> Principal | None:
        item = self._items.get(secret)
        if item is None:
            return None
        deadline, principal = item
        if deadline < time.monotonic() or principal.expired(datetime.now(UTC)):
            self._items.pop(secret, None)
            return None
        return principal

    def put(self, secret: str, principal: Principal) -> None:
        if self.ttl <= 0:
            return
        if len(self._items) >= self.size:
            self._items.clear()
        self._items[secret] = (time.monotonic() + self.ttl, principal)


class InflightLimit:
    """At most ``limit`` ingest batches in flight per process; beyond it, push back (503).

    Used from the event loop only, so a plain counter is enough.
    """

    def __init__(self, limit: int) -> None:
        self.limit, self.inflight = limit, 0

    def __enter__(self) -> InflightLimit:
        if self.inflight >= self.limit:
            raise Pushback(
                f"the ledger is busy ({self.inflight} batches in flight); retry shortly",
                code="busy",
                retry_after=1.0,
            )
        self.inflight += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.inflight -= 1


@dataclass
class AppState:
    settings: Settings
    db: Database
    log_key: SigningKey
    metrics: Metrics
    origin: str
    token_cache: TokenCache
    ingest_limit: InflightLimit
    # One-call cache lookups: verified answers by key, and pools resolved to fingerprints.
    hot_answers: HotAnswers = field(default_factory=HotAnswers)
    pool_contracts: PoolContracts = field(default_factory=PoolContracts)
    cache_rows: AsyncRows | None = None  # api.cache_fast's index reader
    # For replay orders and certification probes to workers' collectors: made on first use
    # (inside the event loop), closed when the app shuts down.
    http: httpx.AsyncClient | None = None
    # Certification jobs this process runs (api.certifier.Run by ID); their state is in the
    # database, under leases held by runner_id (unique per process and app).
    jobs: dict[str, Any] = field(default_factory=dict)
    runner_id: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )

    @property
    def workers_http(self) -> httpx.AsyncClient:
        if self.http is None:
            # Connects only to addresses the worker URL policy allows (api.workers_client).
            self.http = new_client(self.settings)
        return self.http


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.ledger
    return state


async def _state_dependency(request: Request) -> AppState:
    # async: FastAPI runs a plain ``def`` dependency in its thread pool, a hand-off that cost
    # about half a millisecond per request here.
    return get_state(request)


StateDep = Annotated[AppState, Depends(_state_dependency)]
