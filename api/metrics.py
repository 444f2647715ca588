"""Prometheus metrics: the API's own counters, and gauges of the log read at each scrape.

One registry per app, so tests and several apps in one process never collide. Under
``ledger serve --workers N`` the parent sets ``PROMETHEUS_MULTIPROC_DIR`` (a fresh directory)
before the workers start: each process writes its counters there and a scrape, whichever
process answers it, sums them all (prometheus_client's multiprocess mode), so counts never
jump back between scrapes. The log gauges are read from the database when scraped
(:class:`LogGauges`), so every process answers the same.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from fastapi import Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledger.checkpoint import verify_checkpoint
from ledger.errors import LedgerError
from ledger.signing import SigningKey
from ledger.storage import checkpoints, log, workers
from ledger.storage.database import Database

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


# The method label takes only these values (a server that passes any token as a method would
# otherwise let a client create a series per request).
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class LogGauges(Collector):
    """The log as it stands at the scrape: tree size, the latest checkpoint (its size, and the
    age of its signed time, from a note verified under the log key), live workers per pool and
    the records each live collector's spool holds unacknowledged (from its signed heartbeat)."""

    def __init__(
        self, db: Database, log_key: SigningKey, worker_ttl: float, now: Callable[[], datetime]
    ) -> None:
        self.db, self.log_key, self.worker_ttl, self.now = db, log_key, worker_ttl, now

    def collect(self) -> Iterator[Metric]:
        with self.db.read() as s:
            size = log.log_size(s)
            try:
                latest = checkpoints.latest_in(s)
            except LedgerError:  # a row edited away from its note: no figure (audit names it)
                latest = None
        yield GaugeMetricFamily("ledger_log_tree_size", "Leaves in the log", value=size)
        if latest is not None:
            try:
                cp = verify_checkpoint(latest.note, self.log_key.public_key)
            except LedgerError:
                cp = None  # a checkpoint that does not verify gives no figure (audit names it)
            if cp is not None:
                yield GaugeMetricFamily(
                    "ledger_log_checkpoint_tree_size",
                    "Tree size of the latest signed checkpoint",
                    value=cp.tree_size,
                )
            if cp is not None and cp.signed_at is not None:
                yield GaugeMetricFamily(
                    "ledger_log_checkpoint_age_seconds",
                    "Seconds since the log signed its latest checkpoint (its signed time)",
                    value=(self.now() - cp.signed_at).total_seconds(),
                )
        live = GaugeMetricFamily("ledger_workers_live", "Live workers by pool", labels=["pool"])
        pending = GaugeMetricFamily(
            "ledger_collector_spool_pending",
            "Records a live collector's spool holds that the ledger has not acknowledged, as "
            "its last signed heartbeat said",
            labels=["pool", "worker_id"],
        )
        for pool in workers.pools(self.db, self.worker_ttl):
            live.add_metric([pool.name], len(pool.live))
            for w in pool.live:
                if w.spool_pending is not None:
                    pending.add_metric([w.pool, w.worker_id], w.spool_pending)
        yield live
        yield pending


class Metrics:
    def __init__(self, log_gauges: Collector | None = None) -> None:
        self.registry = CollectorRegistry()
        self.log_gauges = log_gauges
        self._render = threading.Lock()  # the gauges join the registry for one scrape at a time
        self.requests = Counter(
            "ledger_http_requests_total",
            "HTTP requests by route, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "ledger_http_request_duration_seconds",
            "HTTP request latency by route",
            ["route"],
            registry=self.registry,
        )
        self.errors = Counter(
            "ledger_errors_total",
            "Refused requests by error code",
            ["code"],
            registry=self.registry,
        )
        self.records = Counter(
            "ledger_records_ingested_total",
            "Record envelopes accepted, by outcome (created, duplicate)",
            ["status"],
            registry=self.registry,
        )
        self.replays = Counter(
            "ledger_replays",
            "Replay verdicts logged, by verdict",
            ["verdict"],
            registry=self.registry,
        )
        self.cache_lookups = Counter(
            "ledger_cache_lookups",
            "One-call cache lookups answered, by outcome (hit, or the miss's reason) and how "
            "the answer was reached (kept: verified before, its index rows unchanged; first: "
            "verified from one read of the key's rows and log entries; log: the full check; "
            "request: decided from the request alone)",
            ["outcome", "via"],
            registry=self.registry,
        )
        self.erasures = Counter(
            "ledger_content_erased",
            "Records whose content was erased, by reason (request, retention)",
            ["reason"],
            registry=self.registry,
        )
        self.retention_runs = Counter(
            "ledger_retention_runs",
            "Retention purges run, by outcome (done, failed)",
            ["outcome"],
            registry=self.registry,
        )
        self.retention_held = Counter(
            "ledger_retention_held",
            "Records past the retention kept because a legal hold covers them (per purge run)",
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "ledger_ingest_batch_size",
            "Envelopes per accepted ingest batch",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 5000),
            registry=self.registry,
        )
        # Each process keeps its own answers: livesum adds up the live processes' figures.
        self.cache_kept_bytes = Gauge(
            "ledger_cache_kept_bytes",
            "Memory the kept cache answers are charged, over the server's processes (each "
            "keeps at most LEDGER_CACHE_MEMORY_BYTES)",
            multiprocess_mode="livesum",
            registry=self.registry,
        )
        self.cache_kept_answers = Gauge(
            "ledger_cache_kept_answers",
            "Cache answers kept, over the server's processes",
            multiprocess_mode="livesum",
            registry=self.registry,
        )
        self.cache_kept_limit = Gauge(
            "ledger_cache_kept_bytes_limit",
            "What the kept cache answers may be charged, over the server's processes",
            multiprocess_mode="livesum",
            registry=self.registry,
        )
        self.group_size = Histogram(
            "ledger_ingest_group_batches",
            "Ingest batches appended per transaction (group commit)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=self.registry,
        )

    def cache_kept(self, size: int, answers: int) -> None:
        """HotAnswers' on_change: how full this process's kept answers are."""
        self.cache_kept_bytes.set(size)
        self.cache_kept_answers.set(answers)

    def render(self) -> Response:
        """The exposition (call it off the event loop: the log gauges read the database)."""
        with self._render:
            return self._exposition()

    def _exposition(self) -> Response:
        directory = os.environ.get(MULTIPROC_ENV)
        if directory:
            forget_dead_processes(directory)
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # every process's counters, summed
        else:
            registry = self.registry
        if self.log_gauges is not None:
            registry.register(self.log_gauges)
        try:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
        finally:
            if self.log_gauges is not None:
                registry.unregister(self.log_gauges)


_LIVE_GAUGE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db")


def forget_dead_processes(directory: str) -> None:
    """Drop the live gauges of processes that are gone (a worker the server restarted): a
    ``livesum`` gauge sums the files of the processes named there, and nothing else removes a
    dead one's (prometheus_client leaves that to the server's process manager)."""
    try:
        names = os.listdir(directory)
    except OSError:  # removed as the server stops
        return
    pids = {int(m[1]) for m in map(_LIVE_GAUGE_FILE.fullmatch, names) if m}
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):  # another process's scrape removed it first
                mark_process_dead(pid, directory)
        except PermissionError:  # alive, under another user
            pass


def utc_now() -> datetime:
    return datetime.now(UTC)


class MetricsMiddleware:
    """Plain ASGI middleware (no per-request Request objects): latency, status, error codes,
    and each answer's ``Server-Timing: app;dur=<ms>`` header."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                # The server's own time up to its answer's head (W3C Server Timing), so a
                # client can tell it from the network's.
                took = (time.perf_counter() - start) * 1000
                headers = [*message.get("headers", ()), (b"server-timing", b"app;dur=%.3f" % took)]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            m = self.metrics
            path = getattr(scope.get("route"), "path", "unmatched")
            m.latency.labels(path).observe(time.perf_counter() - start)
            method = scope["method"] if scope["method"] in _METHODS else "other"
            m.requests.labels(path, method, str(status)).inc()
            code = scope.get("state", {}).get("error_code")
            if code:
                m.errors.labels(code).inc()
