"""The collector's engine client over real HTTP: line splitting, errors, early close, and
connections the engine closes before answering."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from collectors.upstream import Upstream
from demo.server_thread import ServerThread, free_port
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
    async def job(upstream: Upstream) -> list[bytes]:
        async with upstream.stream("GET", "/events") as response:
            assert response.status == 200
            assert response.content_type.startswith("text/event-stream")
            return [line async for lines in response.lines() for line in lines]

    assert run(server.url, job) == [
        b"data: abc",
        b"",
        "data: café".encode(),
        b"",
        b": note",
        b"tail",
    ]


def test_an_error_status_is_an_answer_with_its_body(server):
    async def job(upstream: Upstream):
        return await upstream.request("POST", "/echo", body=b"{}", headers={"x-a": "1"})

    answer = run(server.url, job)
    assert (answer.status, answer.content_type, answer.body) == (418, "application/x-echo", b"{}")


def test_leaving_a_stream_early_closes_the_connection(server):
    closed.clear()

    async def job(upstream: Upstream) -> bytes:
        async with upstream.stream("GET", "/endless") as response:
            async for lines in response.lines():
                return lines[0]
        return b""

    assert run(server.url, job) == b"data: more"
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


class ClosingServer:
    """A raw HTTP/1.1 server on its own thread that answers ``answered`` requests on each
    connection, keeping it alive, and closes the connection on the next one after reading it,
    without answering: a keep-alive that expires just as the client reuses the connection."""

    def __init__(self, answered: int) -> None:
        self.answered = answered
        self.requests = 0
        self.connections = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ClosingServer:
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *_: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)
        assert not self._thread.is_alive(), "the server's thread did not stop"

    def _run(self) -> None:
        # asyncio.run closes the loop, after cancelling the connections' tasks: a loop left
        # open is closed by its finalizer at some garbage collection, which fails ("Invalid
        # file descriptor: -1") when the collector has finalized the loop's self-pipe first.
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                ),
                0,
            )
            await reader.readexactly(length)
            self.requests += 1
            if served == self.answered:
                break
            served += 1
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b'content-length: 12\r\n\r\n{"ok": true}'
            )
            await writer.drain()
        writer.close()


def test_a_connection_closed_as_it_is_reused_is_retried_once_on_a_new_one():
    with ClosingServer(answered=1) as engine:

        async def job(upstream: Upstream) -> list[int]:
            first = await upstream.request("POST", "/v1/completions", body=b"{}")
            second = await upstream.request("POST", "/v1/completions", body=b"{}")
            return [first.status, second.status]

        assert run(engine.url, job) == [200, 200]
        # the second request reached the closing connection, then a new one
        assert (engine.requests, engine.connections) == (3, 2)


def test_an_engine_that_keeps_closing_is_unreachable_after_one_retry():
    with ClosingServer(answered=0) as engine:

        async def job(upstream: Upstream):
            return await upstream.request("POST", "/v1/completions", body=b"{}")

        with pytest.raises(Unreachable) as err:
            run(engine.url, job)
        assert err.value.code == "engine_unreachable"
        assert (engine.requests, engine.connections) == (2, 2)
