"""Metric labels take bounded values only, whatever a client sends."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import generate_latest

from api.metrics import Metrics, MetricsMiddleware


def test_a_method_the_ledger_does_not_serve_is_counted_as_other() -> None:
    """A server that passes any token through as the method would otherwise give a client a
    new series per request (a cardinality attack)."""
    metrics = Metrics()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 405, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = MetricsMiddleware(app, metrics)

    async def call(method: str) -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(_: Any) -> None:
            return None

        scope = {"type": "http", "method": method, "path": "/x", "headers": []}
        await middleware(scope, receive, send)

    async def main() -> None:
        for i in range(50):
            await call(f"M{i}")
        await call("GET")

    asyncio.run(main())
    text = generate_latest(metrics.registry).decode()
    counted = [line for line in text.splitlines() if line.startswith("ledger_http_requests_total{")]
    assert any('method="other"' in line and line.endswith(" 50.0") for line in counted), counted
    assert any('method="GET"' in line for line in counted)
    assert not any('method="M' in line for line in counted)
