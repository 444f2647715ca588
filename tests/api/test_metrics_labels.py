"""Metric labels take bounded values only, whatever a client sends."""

from __future__ import annotations

import asyncio
import os
from typing import Any
from unittest import mock

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


def test_the_live_gauges_of_dead_processes_are_dropped(tmp_path) -> None:
    """A worker killed and restarted leaves its live gauge file: a scrape drops those of
    processes that are gone, keeps the living ones', and answers when another scrape removed
    them first or the directory itself is gone (the server stopping)."""
    import subprocess
    import sys

    from api.metrics import forget_dead_processes

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True
    )
    dead_pid = int(dead.stdout)
    for pid in (dead_pid, os.getpid()):
        (tmp_path / f"gauge_livesum_{pid}.db").write_bytes(b"")
    (tmp_path / f"counter_{dead_pid}.db").write_bytes(b"")  # counters are kept: they add up
    forget_dead_processes(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"gauge_livesum_{os.getpid()}.db", f"counter_{dead_pid}.db"]
    )
    (tmp_path / f"gauge_livesum_{dead_pid}.db").write_bytes(b"")
    original = os.remove

    def raced(path: str) -> None:  # another process's scrape removes it first
        original(path)
        original(path)

    with mock.patch("os.remove", raced):
        forget_dead_processes(str(tmp_path))
    forget_dead_processes(str(tmp_path / "gone"))
