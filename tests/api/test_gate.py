"""The gate (api/gate.py) as an ASGI app around a route that FastAPI itself would read first:
a pydantic body parameter beside a scope dependency. The receive channel counts what the app
asked for, so "not read" is measured, not inferred."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from api import errors
from api.auth import Admin
from api.gate import Gate
from api.metrics import Metrics
from api.settings import Settings
from api.state import AppState, InflightLimit, TokenCache
from ledger.tokens import Principal

LIMIT = 4096
JSON = {"content-type": "application/json"}
CHUNK = 1024


class Item(BaseModel):
    x: int


def _app(gated: bool) -> FastAPI:
    settings = Settings(max_body_bytes=LIMIT, body_timeout=0.3)
    state = AppState(
        settings=settings,
        db=None,  # type: ignore[arg-type]  # tokens below are cached: no lookup happens
        log_key=None,  # type: ignore[arg-type]
        metrics=Metrics(),
        origin="test",
        token_cache=TokenCache(60),
        ingest_limit=InflightLimit(1),
    )
    state.token_cache.put("admin", Principal("a", "admin", ("admin",)))
    state.token_cache.put("reader", Principal("r", "reader", ("records:read",)))
    app = FastAPI()
    app.state.ledger = state

    @app.post("/items")
    async def items(item: Item, _: Admin) -> dict[str, int]:
        return {"x": item.x}

    @app.get("/open")
    async def open_route() -> dict[str, str]:
        return {"ok": "yes"}

    if gated:
        app.add_middleware(Gate, routes=app.router.routes, state=state)
    errors.install(app)
    return app


class Client:
    """Drives one request; ``reads`` counts the body messages the app received."""

    def __init__(self, chunks: list[bytes], *, stall: bool = False) -> None:
        self.chunks, self.stall, self.reads = chunks, stall, 0
        self.messages: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if self.reads >= len(self.chunks):
            if self.stall:
                await asyncio.sleep(3600)
            return {"type": "http.disconnect"}
        self.reads += 1
        more = self.stall or self.reads < len(self.chunks)
        return {"type": "http.request", "body": self.chunks[self.reads - 1], "more_body": more}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        status: int = self.messages[0]["status"]
        return status

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.messages[0]["headers"]}

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


def _call(app: FastAPI, client: Client, headers: dict[str, str], path: str = "/items") -> None:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST" if path == "/items" else "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "server": ("test", 80),
        "client": ("test", 1),
    }
    asyncio.run(app(scope, client.receive, client.send))


def _many(n: int) -> list[bytes]:
    """``n`` chunks of one valid JSON document: {"x": 1, then whitespace, then }."""
    return [b'{"x": 1' + b" " * (CHUNK - 7)] + [b" " * CHUNK] * (n - 2) + [b"}"]


def test_without_the_gate_fastapi_reads_the_whole_body_before_the_token_check():
    client = Client(_many(50))  # the control: why the gate exists
    _call(_app(gated=False), client, {"content-type": "application/json"})
    assert client.status == 401 and client.reads == 50


@pytest.mark.parametrize(
    ("token", "status", "code"),
    [(None, 401, "missing_token"), ("nope x", 401, "invalid_token"), ("reader", 403, None)],
)
def test_the_gate_refuses_before_a_single_read(token: str | None, status: int, code: str | None):
    client = Client(_many(50))
    headers = {"content-type": "application/json", "transfer-encoding": "chunked"}
    if token:
        headers["authorization"] = token if " " in token else f"Bearer {token}"
    _call(_app(gated=True), client, headers)
    assert client.status == status and client.reads == 0
    assert client.headers["connection"] == "close"  # the unread body is never waited for
    if code:
        assert code.encode() in client.body
    else:
        assert b"insufficient_scope" in client.body


def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit():
    client = Client(_many(50))
    headers = {"authorization": "Bearer admin", "transfer-encoding": "chunked"}
    _call(_app(gated=True), client, headers)
    assert client.status == 413 and b"body_too_large" in client.body
    assert client.reads == LIMIT // CHUNK + 1  # the chunk that passed it, and no more
    assert client.headers["connection"] == "close"


def test_a_declared_length_over_the_limit_is_refused_unread():
    client = Client(_many(50))
    headers = {"authorization": "Bearer admin", "content-length": str(50 * CHUNK)}
    _call(_app(gated=True), client, headers)
    assert client.status == 413 and client.reads == 0


def test_a_stalled_body_times_out():
    client = Client([b'{"x":'], stall=True)
    headers = {"authorization": "Bearer admin", "content-length": "100"}
    _call(_app(gated=True), client, headers)
    assert client.status == 408 and b"body_timeout" in client.body
    assert client.headers["connection"] == "close"


def test_a_good_request_passes_untouched():
    client = Client([b'{"x": 7}'])
    headers = {"authorization": "Bearer admin", "content-length": "8", **JSON}
    _call(_app(gated=True), client, headers)
    assert client.status == 200 and client.body == b'{"x":7}'
    assert "connection" not in client.headers
    public = Client([])
    _call(_app(gated=True), public, {}, path="/open")
    assert public.status == 200


def test_the_route_match_cache_keeps_no_long_path() -> None:
    """Routes are matched before the token is checked: a path of 60,000 characters that
    matches ``/records/{rid}`` is answered (401, 404) but not kept, so 4096 of them do not
    hold 256 MiB; short paths are kept as before."""
    from api.gate import RouteRules

    app = FastAPI()

    @app.get("/records/{rid}")
    async def record(rid: str) -> dict[str, str]:
        return {"rid": rid}

    rules = RouteRules(app.router.routes)

    def scope(path: str) -> dict[str, Any]:
        return {"type": "http", "method": "GET", "path": path, "root_path": "", "headers": []}

    for i in range(50):
        assert rules.match(scope(f"/records/{i:06d}" + "a" * 60_000)) is not None
    assert rules._matched == {}
    assert rules.match(scope("/records/req-1")) is not None
    assert list(rules._matched) == [("GET", "/records/req-1")]
