"""What the app holds: the database, the ledger key, the settings, the metrics."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
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
from ledger.storage import ingest
from ledger.storage.cache_lookup import AsyncRows, HotAnswers, PoolContracts
from ledger.storage.database import Database
from ledger.storage.group_commit import GroupCommit
from ledger.storage.ingest import CheckedBatch, IngestResult
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


# Records one ingest transaction appends at most (a larger batch still goes, alone).
GROUP_RECORDS = 2000


class InflightLimit:
    """At most ``limit`` ingest batches, and ``max_bytes`` of their bodies, in flight per
    process; beyond either, push back (503). A batch counts its Content-Length (the body
    limit when it declares none); one batch is always admitted, whatever its size.

    Used from the event loop only, so plain counters are enough.
    """

    def __init__(self, limit: int, max_bytes: int | None = None) -> None:
        self.limit, self.inflight = limit, 0
        self.max_bytes, self.bytes = max_bytes, 0

    @contextmanager
    def admit(self, size: int = 0) -> Iterator[None]:
        busy = self.inflight >= self.limit or (
            self.inflight > 0 and self.max_bytes is not None and self.bytes + size > self.max_bytes
        )
        if busy:
            raise Pushback(
                f"the ledger is busy ({self.inflight} batches, {self.bytes} bytes in flight); "
                "retry shortly",
                code="busy",
                retry_after=1.0,
            )
        self.inflight += 1
        self.bytes += size
        try:
            yield
        finally:
            self.inflight -= 1
            self.bytes -= size


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
    # Checked ingest batches are appended by one writer per process, many to a transaction.
    ingest_writer: GroupCommit[CheckedBatch, list[IngestResult]] = field(init=False)
    runner_id: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )

    def __post_init__(self) -> None:
        self.ingest_writer = GroupCommit(
            lambda batches: ingest.write_batches(self.db, batches),
            max_group=GROUP_RECORDS,
            name="ledger-ingest",
            on_group=self.metrics.group_size.observe,
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
