"""Prometheus metrics, one registry per app (so tests and several apps never collide)."""

from __future__ import annotations

import time

from fastapi import Response
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send


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
        self.replays = Counter(
            "ledger_replays",
            "Replay verdicts logged, by verdict",
            ["verdict"],
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


class MetricsMiddleware:
    """Plain ASGI middleware (no per-request Request objects): latency, status, error codes."""

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
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            m = self.metrics
            path = getattr(scope.get("route"), "path", "unmatched")
            m.latency.labels(path).observe(time.perf_counter() - start)
            m.requests.labels(path, scope["method"], str(status)).inc()
            code = scope.get("state", {}).get("error_code")
            if code:
                m.errors.labels(code).inc()
