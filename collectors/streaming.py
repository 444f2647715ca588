"""A streamed exchange: vLLM's server-sent events pass to the client as they come, and the
record is in the durable spool before ``data: [DONE]`` is sent.

- An event vLLM sent that is not a JSON chunk passes as it came.
- An error chunk mid-stream (vLLM failed after it began) reaches the client as sent, and the
  record of what came before is marked ``aborted``.
- A stream that holds nothing a record can be built from (vLLM's error chunk alone) still
  reaches the client byte for byte, ``[DONE]`` included, and is counted as unrecordable.
- A client that leaves mid-stream leaves a record of what it was sent, marked ``aborted``; one
  that leaves before the first chunk leaves none (nothing was read from the engine), and
  closing the engine's stream stops the generation either way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from collectors.edge import REQUEST_ID_HEADER, engine_headers
from collectors.errors import error_response
from collectors.exchange import engine_json
from collectors.recording import Exchange, count_unrecordable, record_aborted
from collectors.upstream import Streamed, Upstream
from ledger.errors import InvalidInput, Unreachable


async def forward_stream(request: Request, engine: Upstream, ex: Exchange, own: float) -> Response:
    """The client's streamed request, sent to the engine; its answer, as a stream when the
    engine accepted it (the exchange then ends with the response), else as vLLM sent it."""
    metrics = ex.state.metrics
    endpoint, request_id = ex.endpoint, ex.request_id
    stack = AsyncExitStack()  # the engine's response: closed here, or when streamed
    try:
        upstream = await stack.enter_async_context(
            engine.stream(
                "POST", endpoint, body=ex.engine_raw, headers=engine_headers(request, request_id)
            )
        )
    except Unreachable as exc:
        metrics.requests.labels(endpoint, "engine_unreachable").inc()
        return error_response(exc, request_id)
    if upstream.status == 200:
        ex.own_s = own

        async def ended() -> None:
            ex.state.in_flight.discard(request_id)
            # The client left before the first chunk: nothing was read from the engine, so
            # there is nothing to record; closing the stream stops the generation.
            if not ex.streaming:
                metrics.requests.labels(endpoint, "aborted").inc()
                await asyncio.shield(stack.aclose())

        return EndsWithTheResponse(
            relay(ex, upstream, stack),
            ended,
            media_type=upstream.content_type or "text/event-stream",
            headers={**upstream.passed, REQUEST_ID_HEADER: request_id},
        )
    async with stack:
        try:
            content = await upstream.read()
        except Unreachable as exc:
            metrics.requests.labels(endpoint, "engine_unreachable").inc()
            return error_response(exc, request_id)
    metrics.engine_errors.labels(str(upstream.status)).inc()
    metrics.requests.labels(endpoint, "engine_error").inc()
    return Response(
        content,
        upstream.status,
        media_type=upstream.content_type,
        headers={**upstream.passed, REQUEST_ID_HEADER: request_id},
    )


async def relay(
    ex: Exchange, upstream: Streamed, stack: AsyncExitStack
) -> AsyncGenerator[bytes, None]:
    """The client's stream: vLLM's events, each reshaped to what the client asked for, and the
    record spooled before ``[DONE]``; on any other end, the record of a client that left."""
    metrics = ex.state.metrics
    finished = False
    ex.streaming = True
    feed, for_client, reshapes = ex.acc.feed, ex.for_client, ex.plan.reshapes
    try:
        async for lines in upstream.lines():
            out: list[bytes] = []  # this read's events, relayed in one write (their parts)
            for line in lines:
                if not line.startswith(b"data: "):
                    if line:
                        out += (line, b"\n\n")
                    continue
                payload = line[6:]
                if payload[:1] != b"{" and payload.strip() == b"[DONE]":
                    if out:  # what came before goes out before the record's commit
                        yield b"".join(out)
                        out = []
                    began = time.perf_counter()
                    try:
                        await ex.spool_async()
                    except InvalidInput as exc:
                        # Nothing a record can hold (an error chunk alone): the client still
                        # gets the stream as vLLM sent it, and /metrics counts it.
                        count_unrecordable(ex, exc, metrics)
                    else:
                        metrics.added_latency.observe(ex.own_s + time.perf_counter() - began)
                        outcome = "engine_error" if ex.engine_error else "recorded"
                        metrics.requests.labels(ex.endpoint, outcome).inc()
                    finished = True
                    out.append(b"data: [DONE]\n\n")
                    continue
                data = _chunk(payload)
                if data is None:
                    out += (line, b"\n\n")
                    continue
                if "error" in data and not data.get("choices"):
                    # vLLM failed mid-stream: the client gets its error as sent, and the
                    # record, of what came before, is marked aborted.
                    ex.engine_error = True
                    metrics.engine_errors.labels("stream").inc()
                    out += (line, b"\n\n")
                    continue
                if feed(data) and ex.ttft_ns is None:
                    ex.ttft_ns = time.perf_counter_ns() - ex.started_ns
                if reshapes:
                    out += (b"data: ", for_client(data), b"\n\n")
                else:
                    out += (line, b"\n\n")
            if out:
                yield b"".join(out)
    finally:
        if not finished:
            # The client went away (or the engine did): record what was generated. This runs
            # inside a cancelled scope, so a task of its own signs and commits it.
            record_aborted(ex, metrics)
        await asyncio.shield(stack.aclose())


def _chunk(payload: bytes) -> dict[str, Any] | None:
    try:
        data = engine_json(payload)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


class EndsWithTheResponse(StreamingResponse):
    """A streamed answer whose exchange ends with the response, however it ends.

    When the client goes away, Starlette stops sending but leaves the body's generator
    suspended until the garbage collector finds it; closing it here records the aborted
    exchange and releases the engine's stream at once. ``ended`` runs last, also for a client
    gone before the first chunk (the generator never ran, so closing it runs nothing).
    """

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        ended: Callable[[], Awaitable[None]],
        **kw: Any,
    ) -> None:
        super().__init__(body, **kw)
        self._body = body
        self._ended = ended

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._body.aclose()
            await self._ended()
