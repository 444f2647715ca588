"""Prometheus metrics, one registry per app (so tests and several apps never collide)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import Request, Response
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        self.batch_size = Histogram(
            "ledger_ingest_batch_size",
            "Envelopes per accepted ingest batch",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 5000),
            registry=self.registry,
        )

    def render(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    async def middleware(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        self.latency.labels(path).observe(time.perf_counter() - start)
        self.requests.labels(path, request.method, str(response.status_code)).inc()
        code = getattr(request.state, "error_code", None)
        if code:
            self.errors.labels(code).inc()
        return response
