"""The collector's engine client over real HTTP: line splitting, errors, early close."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from cli.server_thread import ServerThread, free_port
from collectors.upstream import Upstream
from ledger.errors import Unreachable

# Server-sent events cut at awkward places: mid-line, mid-"\r\n", mid-UTF-8 character.
CHUNKS = [b"data: a", b"bc\r", b"\n\r\ndata: caf\xc3", b"\xa9\n\n", b": note\n", b"tail"]
closed = threading.Event()


async def events(_: Request) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        for chunk in CHUNKS:
            yield chunk
            await asyncio.sleep(0.01)

    return StreamingResponse(body(), media_type="text/event-stream")


async def endless(_: Request) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"data: more\n\n"
                await asyncio.sleep(0.01)
        finally:  # the client closed the connection
            closed.set()

    return StreamingResponse(body(), media_type="text/event-stream")


async def echo(request: Request) -> Response:
    return Response(await request.body(), 418, media_type="application/x-echo")


@pytest.fixture(scope="module")
def server():
    app = Starlette(
        routes=[
            Route("/events", events),
            Route("/endless", endless),
            Route("/echo", echo, methods=["POST"]),
        ]
    )
    thread = ServerThread(app, "127.0.0.1", free_port()).start()
    yield thread
    thread.stop()


def run(url: str, job):
    async def main():
        upstream = Upstream(url)
        await upstream.open()
        try:
            return await job(upstream)
        finally:
            await upstream.close()

    return asyncio.run(main())


def test_lines_are_split_at_line_ends_whatever_the_chunks(server):
    async def job(upstream: Upstream) -> list[str]:
        async with upstream.stream("GET", "/events") as response:
            assert response.status == 200
            assert response.content_type.startswith("text/event-stream")
            return [line async for line in response.lines()]

    assert run(server.url, job) == ["data: abc", "", "data: café", "", ": note", "tail"]


def test_an_error_status_is_an_answer_with_its_body(server):
    async def job(upstream: Upstream):
        return await upstream.request("POST", "/echo", body=b"{}", headers={"x-a": "1"})

    answer = run(server.url, job)
    assert (answer.status, answer.content_type, answer.body) == (418, "application/x-echo", b"{}")


def test_leaving_a_stream_early_closes_the_connection(server):
    closed.clear()

    async def job(upstream: Upstream) -> str:
        async with upstream.stream("GET", "/endless") as response:
            async for line in response.lines():
                return line
        return ""

    assert run(server.url, job) == "data: more"
    assert closed.wait(5), "the server never saw the client go away"


def test_an_engine_that_does_not_answer_is_unreachable():
    url = f"http://127.0.0.1:{free_port()}"

    async def job(upstream: Upstream):
        return await upstream.request("GET", "/v1/models")

    with pytest.raises(Unreachable) as err:
        run(url, job)
    assert err.value.code == "engine_unreachable" and url in err.value.message


def test_calls_before_open_are_refused():
    async def main():
        async with Upstream("http://127.0.0.1:1").stream("GET", "/"):
            pass

    with pytest.raises(RuntimeError, match="open"):
        asyncio.run(main())
