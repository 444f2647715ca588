"""The recording proxy: an OpenAI-compatible front for one vLLM server (Starlette, ASGI).

``/v1/completions`` and ``/v1/chat/completions`` (streaming or not) are forwarded with what the
record needs added (see ``exchange``); the client gets vLLM's answer in the shape it asked for,
with ``X-Request-ID``. The signed record is in the durable spool before the response completes:
before the body is sent, or, when streaming, before ``data: [DONE]``. A client that goes away
mid-stream still leaves a record of what was generated, marked ``aborted``; one that leaves a
non-streamed request closes the engine's connection, so vLLM aborts the generation. Requests
are read as vLLM reads them (``collectors/vllm_request.py``); one the collector cannot read so
goes to vLLM unchanged and vLLM's answer back unchanged (a 2xx there is counted in
``collector_unrecordable_total``, never recorded). Engine errors are passed through unchanged
(status, body) and counted. ``/v1/models`` and ``/health`` pass
through; ``/metrics`` is the collector's own; ``/ledger/v1/replay`` runs the ledger's signed
replay orders (``collectors/replay.py``), never recorded as traffic.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from collectors.exchange import CHAT, COMPLETIONS, Accumulator, ClientView, Plan, dumps, plan
from collectors.metrics import CollectorMetrics
from collectors.replay import REPLAY_PATH, handle_replay
from collectors.spool import Spool
from collectors.tiers import TIER_HEADER, check_tier, parse_tier, refusal_if_answered
from collectors.tokens import TokenRenderer
from collectors.upstream import Streamed, Upstream
from collectors.vllm_request import Unsure, is_json_media_type
from ledger.errors import Conflict, InvalidInput, LedgerError, StorageError, Unreachable
from ledger.records import RECORD_KIND, build_record_body
from ledger.signing import SigningKey, sign_envelope

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
_FORWARD_HEADERS = ("authorization", "content-type", "accept")
# Path segments a request ID must not be: the ledger serves records at /v1/records/{ID}.
_PATH_TRICKS = frozenset({".", ".."})
_OTHER_METHODS = ["GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"]
_STATUS = {InvalidInput: 400, Conflict: 409, Unreachable: 502, StorageError: 503}

logger = logging.getLogger("ledger.collector")
T = TypeVar("T")


@dataclass
class WorkerState:
    """What every record of this worker carries; the fingerprint changes on engine restarts."""

    engine_url: str
    worker_id: str
    pool: str
    default_tier: int
    key: SigningKey
    spool: Spool
    fingerprint_id: str
    batch_invariance: str
    # The ledger's log key: replay orders must be signed by it (None: no replays taken).
    log_public_key: Ed25519PublicKey | None = None
    seen_orders: dict[str, float] = field(default_factory=dict)  # replay IDs already run
    metrics: CollectorMetrics = field(default_factory=CollectorMetrics)
    # Renders tokens as vLLM does, so records can keep top-k alternatives' IDs (None: they
    # are not recorded; the model's tokenizer is not one it reproduces exactly).
    renderer: TokenRenderer | None = None
    background: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="record")
    )
    # Request IDs of exchanges under way (touched only on the proxy's event loop): the spool
    # knows an ID once its record is in, so two requests sent at once under one ID are told
    # apart here; and with no other exchange, a record is committed on the loop.
    in_flight: set[str] = field(default_factory=set)


def _error(exc: LedgerError, request_id: str | None = None) -> JSONResponse:
    """The collector's own error answer, in OpenAI's shape, with the request's ID if known."""
    status = next((s for cls, s in _STATUS.items() if isinstance(exc, cls)), 500)
    return JSONResponse(
        {
            "error": {
                "message": exc.message,
                "type": "invalid_request_error" if status < 500 else "server_error",
                "code": exc.code,
                "details": exc.details,
            }
        },
        status_code=status,
        headers={REQUEST_ID_HEADER: request_id} if request_id is not None else None,
    )


def _request_id(request: Request) -> str:
    """The client's X-Request-ID (an empty one counts as none), or a new one."""
    given = request.headers.get(REQUEST_ID_HEADER)
    if not given:
        return f"req-{uuid.uuid4().hex}"
    if len(given) > 200 or not set(given) <= _REQUEST_ID_CHARS or given in _PATH_TRICKS:
        raise InvalidInput(
            "X-Request-ID must be 1-200 characters of A-Z a-z 0-9 . _ : -, and not . or ..",
            code="invalid_request_id",
        )
    return given


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class _Exchange:
    state: WorkerState
    endpoint: str
    request_id: str
    tier: int
    fingerprint_id: str
    plan: Plan
    engine_raw: bytes
    started_at: str
    started_ns: int
    acc: Accumulator
    view: ClientView
    ttft_ns: int | None = None
    own_s: float = 0.0  # the collector's own time on this exchange so far
    streaming: bool = False  # a streamed answer's chunks began to flow
    engine_error: bool = False  # the engine sent an error chunk mid-stream

    def for_client(self, data: dict[str, Any]) -> bytes:
        out = dumps(self.view.shape(data))
        if self.view.mismatches:
            self.state.metrics.render_mismatches.inc(self.view.mismatches)
            logger.warning(
                "request %s: %d token(s) rendered from IDs differed from vLLM's strings",
                self.request_id,
                self.view.mismatches,
            )
            self.view.mismatches = 0
        return out

    def record(self, *, aborted: bool) -> bytes:
        total = time.perf_counter_ns() - self.started_ns
        body = build_record_body(
            request_id=self.request_id,
            fingerprint_id=self.fingerprint_id,
            worker_id=self.state.worker_id,
            pool=self.state.pool,
            tier=self.tier,
            endpoint=self.endpoint,
            model=self.acc.model or str(self.plan.engine_body.get("model", "")),
            request=self.plan.recorded_body,
            prompt_token_ids=self.acc.prompt_token_ids or [],
            choices=self.acc.record_choices(),
            started_at=self.started_at,
            ttft_ns=self.ttft_ns if self.ttft_ns is not None else total,
            total_ns=total,
            system_fingerprint=self.acc.system_fingerprint,
            request_raw=base64.b64encode(self.engine_raw).decode("ascii"),
            aborted=True if aborted else None,
        )
        return sign_envelope(RECORD_KIND, body, self.state.key).canonical

    def spool(self, *, aborted: bool) -> None:
        self.state.spool.put(self.request_id, self.record(aborted=aborted))
        self.state.metrics.spooled.inc()

    async def spool_async(self) -> None:
        """Sign here (a fraction of a millisecond) and wait for the spool's durable commit.

        With no other exchange in flight, the commit (an fsync: about a millisecond on a busy
        host) runs right here, saving two thread hand-offs; a request arriving meanwhile waits
        that long to be read. Otherwise the spool's writer commits it with whatever else has
        queued up, in one transaction.
        """
        envelope = self.record(aborted=self.engine_error)
        spool = self.state.spool
        if len(self.state.in_flight) > 1 or not spool.put_now(self.request_id, envelope):
            await asyncio.wrap_future(spool.submit(self.request_id, envelope))
        self.state.metrics.spooled.inc()


def create_proxy(state: WorkerState) -> Starlette:
    """The proxy app; its connection pool to the engine opens and closes with the app."""
    metrics = state.metrics
    engine = Upstream(state.engine_url)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await engine.open()
        try:
            yield
        finally:
            await engine.close()

    async def passthrough(request: Request) -> Response:
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {h: request.headers[h] for h in _FORWARD_HEADERS if h in request.headers}
        try:
            answer = await engine.request("GET", path, headers=headers)
        except Unreachable as exc:
            return _error(exc)
        return Response(answer.body, answer.status, media_type=answer.content_type)

    async def own_metrics(_: Request) -> Response:
        metrics.pending.set(await run_in_threadpool(state.spool.pending))
        metrics.dead_letters.set(await run_in_threadpool(state.spool.dead_letters))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def headers_for_engine(request: Request, request_id: str) -> dict[str, str]:
        """The client's credentials, content type and accept header, and the request ID."""
        headers = {h: request.headers[h] for h in _FORWARD_HEADERS if h in request.headers}
        headers[REQUEST_ID_HEADER] = request_id
        return headers

    async def forward_unchanged(
        request: Request,
        raw: bytes,
        request_id: str | None,
        reason: str,
        refusal: Conflict | None = None,
    ) -> Response:
        """A request the collector cannot read as vLLM would (not JSON, or values it cannot
        judge): vLLM gets it as the client sent it, and the client vLLM's answer. vLLM
        refuses almost all of these; an answer it accepted is counted, never recorded, and
        withheld for ``refusal`` (the tier's) when the tier would not have allowed it."""
        headers = headers_for_engine(request, request_id or "")
        if request_id is None:
            del headers[REQUEST_ID_HEADER]
        try:
            answer = await _unless_gone(
                request,
                engine.request(request.method, request.url.path, body=raw, headers=headers),
            )
        except Unreachable as exc:
            return _error(exc, request_id)
        if answer is None:  # the client left: closing the connection stopped the engine
            metrics.requests.labels(request.url.path, "aborted").inc()
            return Response(status_code=499)
        metrics.requests.labels(request.url.path, "forwarded_unchanged").inc()
        if 200 <= answer.status < 300 and refusal is not None:
            metrics.refusals.labels(refusal.code).inc()
            return _error(refusal, request_id)
        if 200 <= answer.status < 300:
            metrics.unrecordable.labels(reason).inc()
            logger.warning(
                "request %s: vLLM answered %d to a request the collector could not read (%s): "
                "passed through, not recorded",
                request_id,
                answer.status,
                reason,
            )
        else:
            metrics.engine_errors.labels(str(answer.status)).inc()
        return Response(
            answer.body,
            answer.status,
            media_type=answer.content_type,
            headers={REQUEST_ID_HEADER: request_id} if request_id is not None else None,
        )

    async def other_method(request: Request) -> Response:
        """GET and the rest on a generation path: vLLM's own answer (its JSON 405)."""
        return await forward_unchanged(request, await request.body(), None, "method")

    async def generate(request: Request) -> Response:
        began = time.perf_counter()
        endpoint = request.url.path
        request_id = None
        try:
            request_id = _request_id(request)
            tier = parse_tier(request.headers.get(TIER_HEADER), state.default_tier)
            raw = await request.body()
            body: Any = None
            reason = "media_type"
            if is_json_media_type(request.headers.get("content-type")):
                reason = "not_an_object"
                with contextlib.suppress(ValueError, RecursionError):  # vLLM: 400 as well
                    body = json.loads(raw)
            if isinstance(body, dict):
                reason = "not_judged"
                try:
                    exchange_plan = plan(endpoint, body, can_render=state.renderer is not None)
                    engine_raw = dumps(exchange_plan.engine_body)
                    check_tier(tier, body, state.batch_invariance)
                    reason = ""
                except (Unsure, UnicodeEncodeError, RecursionError, ValueError) as exc:
                    logger.info("request %s forwarded unchanged: %s", request_id, exc)
            if reason:
                refusal = refusal_if_answered(tier, body, state.batch_invariance)
                return await forward_unchanged(request, raw, request_id, reason, refusal)
            if request_id in state.in_flight or state.spool.holds(request_id):
                raise Conflict(
                    f"request ID {request_id!r} was already used with this collector",
                    code="request_id_in_use",
                )
        except LedgerError as exc:
            metrics.refusals.labels(exc.code).inc()
            return _error(exc, request_id)
        ex = _Exchange(
            state=state,
            endpoint=endpoint,
            request_id=request_id,
            tier=tier,
            fingerprint_id=state.fingerprint_id,
            plan=exchange_plan,
            engine_raw=engine_raw,
            started_at=_now(),
            started_ns=time.perf_counter_ns(),
            acc=Accumulator(endpoint, top_k=exchange_plan.top_k),
            view=ClientView(exchange_plan, state.renderer),
        )
        state.in_flight.add(request_id)
        response: Response | None = None
        try:
            if exchange_plan.stream:
                response = await forward_stream(request, ex, time.perf_counter() - began)
            else:
                response = await forward_whole(request, ex, time.perf_counter() - began)
            return response
        finally:
            if not isinstance(response, _EndsWithTheResponse):  # that one releases the ID
                state.in_flight.discard(request_id)

    async def whole(request: Request, ex: _Exchange) -> tuple[int, str | None, bytes]:
        async with engine.stream(
            "POST",
            ex.endpoint,
            body=ex.engine_raw,
            headers=headers_for_engine(request, ex.request_id),
        ) as upstream:
            return upstream.status, upstream.content_type, await upstream.read()

    async def forward_whole(request: Request, ex: _Exchange, own: float) -> Response:
        """A request answered at once: vLLM's answer, recorded before the client gets it. A
        client that leaves first closes the engine's connection, as it would have closed its
        own to vLLM, and vLLM aborts the generation: nothing was read, nothing is recorded."""
        endpoint, request_id = ex.endpoint, ex.request_id
        try:
            answer = await _unless_gone(request, whole(request, ex))
        except Unreachable as exc:
            metrics.requests.labels(endpoint, "engine_unreachable").inc()
            return _error(exc, request_id)
        if answer is None:
            metrics.requests.labels(endpoint, "aborted").inc()
            return Response(status_code=499)  # nobody reads it
        status, content_type, content = answer
        if status != 200:
            metrics.engine_errors.labels(str(status)).inc()
            metrics.requests.labels(endpoint, "engine_error").inc()
            return Response(
                content, status, media_type=content_type, headers={REQUEST_ID_HEADER: request_id}
            )
        after = time.perf_counter()
        try:
            data = json.loads(content)
        except ValueError:
            data = None
        if not isinstance(data, dict):  # not an answer of vLLM's OpenAI server: as it came
            _unrecordable(ex, InvalidInput("the engine's answer is not a JSON object"), metrics)
            return Response(
                content, status, media_type=content_type, headers={REQUEST_ID_HEADER: request_id}
            )
        ex.ttft_ns = time.perf_counter_ns() - ex.started_ns
        ex.acc.feed(data)
        out = content if not ex.plan.reshapes else ex.for_client(data)
        try:
            await ex.spool_async()
        except InvalidInput as exc:
            # vLLM's answer holds nothing a record can be built from: the client gets it,
            # and /metrics counts it.
            _unrecordable(ex, exc, metrics)
            return Response(
                out, 200, media_type="application/json", headers={REQUEST_ID_HEADER: request_id}
            )
        except LedgerError as exc:
            # Fail closed: an answer that cannot be stored is not handed out.
            metrics.requests.labels(endpoint, "not_recorded").inc()
            if isinstance(exc, Conflict):  # the same request ID, sent twice at once
                return _error(exc, request_id)
            return _error(
                StorageError(
                    f"the answer could not be recorded, so it is withheld: {exc.message}",
                    code="not_recorded",
                ),
                request_id,
            )
        metrics.added_latency.observe(own + time.perf_counter() - after)
        metrics.requests.labels(endpoint, "recorded").inc()
        return Response(
            out, 200, media_type="application/json", headers={REQUEST_ID_HEADER: request_id}
        )

    async def forward_stream(request: Request, ex: _Exchange, own: float) -> Response:
        """A streamed request: chunks pass as they come; the record is in before [DONE]."""
        endpoint, request_id = ex.endpoint, ex.request_id
        stack = AsyncExitStack()  # the engine's response: closed here, or when streamed
        try:
            upstream = await stack.enter_async_context(
                engine.stream(
                    "POST",
                    endpoint,
                    body=ex.engine_raw,
                    headers=headers_for_engine(request, request_id),
                )
            )
        except Unreachable as exc:
            metrics.requests.labels(endpoint, "engine_unreachable").inc()
            return _error(exc, request_id)
        if upstream.status == 200:
            ex.own_s = own

            async def ended() -> None:
                state.in_flight.discard(request_id)
                # The client left before the first chunk: nothing was read from the engine,
                # so there is nothing to record; closing the stream stops the generation.
                if not ex.streaming:
                    metrics.requests.labels(endpoint, "aborted").inc()
                    await asyncio.shield(stack.aclose())

            return _EndsWithTheResponse(
                _stream(ex, upstream, stack),
                ended,
                media_type=upstream.content_type or "text/event-stream",
                headers={REQUEST_ID_HEADER: request_id},
            )
        async with stack:
            try:
                content = await upstream.read()
            except Unreachable as exc:
                metrics.requests.labels(endpoint, "engine_unreachable").inc()
                return _error(exc, request_id)
        metrics.engine_errors.labels(str(upstream.status)).inc()
        metrics.requests.labels(endpoint, "engine_error").inc()
        return Response(
            content,
            upstream.status,
            media_type=upstream.content_type,
            headers={REQUEST_ID_HEADER: request_id},
        )

    async def _stream(
        ex: _Exchange, upstream: Streamed, stack: AsyncExitStack
    ) -> AsyncGenerator[bytes, None]:
        finished = False
        ex.streaming = True
        try:
            async for line in upstream.lines():
                if not line.startswith("data: "):
                    if line:
                        yield line.encode() + b"\n\n"
                    continue
                payload = line[6:]
                if payload.strip() == "[DONE]":
                    began = time.perf_counter()
                    try:
                        await ex.spool_async()
                    except InvalidInput as exc:
                        # Nothing a record can hold (an error chunk alone): the client still
                        # gets the stream as vLLM sent it, and /metrics counts it.
                        _unrecordable(ex, exc, metrics)
                    else:
                        metrics.added_latency.observe(ex.own_s + time.perf_counter() - began)
                        outcome = "engine_error" if ex.engine_error else "recorded"
                        metrics.requests.labels(ex.endpoint, outcome).inc()
                    finished = True
                    yield b"data: [DONE]\n\n"
                    continue
                try:
                    data = json.loads(payload)
                except ValueError:
                    data = None
                if not isinstance(data, dict):
                    yield line.encode() + b"\n\n"
                    continue
                if "error" in data and not data.get("choices"):
                    # vLLM failed mid-stream: the client gets its error as sent, and the
                    # record, of what came before, is marked aborted.
                    ex.engine_error = True
                    metrics.engine_errors.labels("stream").inc()
                    yield line.encode() + b"\n\n"
                    continue
                if ex.acc.feed(data) and ex.ttft_ns is None:
                    ex.ttft_ns = time.perf_counter_ns() - ex.started_ns
                if ex.plan.reshapes:
                    yield b"data: " + ex.for_client(data) + b"\n\n"
                else:
                    yield line.encode() + b"\n\n"
        finally:
            if not finished:
                # The client went away (or the engine did): record what was generated. This
                # runs inside a cancelled scope, so hand it to a thread instead of awaiting.
                metrics.requests.labels(ex.endpoint, "aborted").inc()
                state.background.submit(_spool_aborted, ex, metrics)
            await asyncio.shield(stack.aclose())

    async def replay(request: Request) -> Response:
        return await handle_replay(request, state, engine)

    return Starlette(
        lifespan=lifespan,
        routes=[
            Route(REPLAY_PATH, replay, methods=["POST"]),
            Route(COMPLETIONS, generate, methods=["POST"]),
            Route(CHAT, generate, methods=["POST"]),
            Route(COMPLETIONS, other_method, methods=_OTHER_METHODS),
            Route(CHAT, other_method, methods=_OTHER_METHODS),
            Route("/v1/models", passthrough, methods=["GET"]),
            Route("/health", passthrough, methods=["GET"]),
            Route("/metrics", own_metrics, methods=["GET"]),
        ],
    )


class _EndsWithTheResponse(StreamingResponse):
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


async def _unless_gone(request: Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None when the client disconnects first (``work`` is then
    cancelled: the engine's connection closes, and vLLM aborts what it was generating)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, LedgerError):
                await task
    return task.result() if not task.cancelled() else None


async def _disconnected(request: Request) -> None:
    """Return when the client closes its connection (its body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _unrecordable(ex: _Exchange, exc: InvalidInput, metrics: CollectorMetrics) -> None:
    metrics.unrecordable.labels("record_invalid").inc()
    metrics.requests.labels(ex.endpoint, "unrecordable").inc()
    logger.warning("request %s: answered, but no record can hold it: %s", ex.request_id, exc)


def _spool_aborted(ex: _Exchange, metrics: CollectorMetrics) -> None:
    try:
        ex.spool(aborted=True)
    except InvalidInput as exc:
        _unrecordable(ex, exc, metrics)
    except LedgerError as exc:
        if exc.code == "request_id_in_use":
            # The whole exchange was committed as the client left: that record stands.
            logger.info("request %s: the client left as its record was committed", ex.request_id)
            metrics.spooled.inc()
            return
        metrics.refusals.labels(exc.code).inc()
