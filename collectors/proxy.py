"""The recording proxy: an OpenAI-compatible front for one vLLM server (Starlette, ASGI).

``/v1/completions`` and ``/v1/chat/completions`` (streaming or not) are forwarded with what the
record needs added (see ``exchange``); the client gets vLLM's answer in the shape it asked for,
with ``X-Request-ID``. The signed record is in the durable spool before the response completes:
before the body is sent, or, when streaming, before ``data: [DONE]`` (``streaming``). A client
that leaves a non-streamed request closes the engine's connection, so vLLM aborts the
generation (``edge.unless_gone``). Requests are read as vLLM reads them
(``collectors/vllm_request.py``); one the collector cannot read so goes to vLLM unchanged and
vLLM's answer back unchanged (a 2xx there is counted in ``collector_unrecordable_total``, never
recorded). Engine errors are passed through unchanged (status, body) and counted.
vLLM's paths that generate nothing (``PASSED_THROUGH``: health, models, version, tokenizer)
pass through, as do OPTIONS on the generation paths and a browser's CORS preflight on any
path (vLLM's CORS middleware answers it; vLLM's CORS headers pass on with every answer of
vLLM's, and the collector's own answers get vLLM's API key check and CORS headers:
``own_answers``); ``/metrics`` is the collector's own;
``/ledger/v1/replay`` runs the ledger's signed replay orders (``collectors/replay.py``), never
recorded as traffic. The collector's own errors are answered through one table
(``collectors/errors.py``).

The handlers are module-level functions; each finds the worker's state and the engine's
connection pool on the app (:func:`create_proxy` puts them there).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from collectors.edge import (
    REQUEST_ID_HEADER,
    engine_headers,
    request_id_of,
    unless_gone,
)
from collectors.errors import error_response
from collectors.exchange import CHAT, COMPLETIONS, Plan, engine_json, plan
from collectors.own_answers import OwnAnswers, relay
from collectors.recording import Exchange, count_unrecordable, drain_aborted
from collectors.replay import REPLAY_PATH, handle_replay
from collectors.streaming import EndsWithTheResponse, forward_stream
from collectors.tiers import TIER_HEADER, check_tier, parse_tier, refusal_if_answered
from collectors.upstream import ANSWER_MARK, UNASKED, Answer, Upstream
from collectors.vllm_request import (
    RequestJson,
    Unsure,
    is_json_media_type,
    read_request_json,
)
from collectors.worker_state import WorkerState, unsure
from ledger.errors import (
    Conflict,
    InvalidInput,
    LedgerError,
    StorageError,
    Unreachable,
)
from ledger.logs import REQUEST_ID

_OTHER_METHODS = ["GET", "HEAD", "PUT", "PATCH", "DELETE"]  # OPTIONS: vLLM's CORS
_EVERY_METHOD = ["POST", "OPTIONS", *_OTHER_METHODS]
# vLLM's paths that generate nothing and change nothing (unless the engine loads LoRA adapters
# at run time, where any request naming a model it does not know may load one, these too):
# any method goes to vLLM, its answer comes back unchanged. Its other paths either generate
# (``/v1/responses``, ``/v1/messages``, embeddings, scoring...), and would go unrecorded, or
# change the engine (LoRA adapters, sleep, caches), and would change what its fingerprint
# says: they are not served here (but a CORS preflight on them is vLLM's to answer).
PASSED_THROUGH = (
    "/health",
    "/ping",
    "/version",
    "/load",
    "/v1/models",
    "/tokenize",
    "/detokenize",
    "/tokenizer_info",
)

logger = logging.getLogger("ledger.collector")


def create_proxy(state: WorkerState) -> Starlette:
    """The proxy app; its connection pool to the engine opens and closes with the app."""
    engine = Upstream(state.engine_url)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await engine.open()
        try:
            yield
        finally:
            await drain_aborted(state)
            await engine.close()

    app = Starlette(
        lifespan=lifespan,
        routes=[
            Route(REPLAY_PATH, replay, methods=["POST"]),
            Route(COMPLETIONS, generate, methods=["POST"]),
            Route(CHAT, generate, methods=["POST"]),
            Route(COMPLETIONS, other_method, methods=_OTHER_METHODS),
            Route(CHAT, other_method, methods=_OTHER_METHODS),
            Route(COMPLETIONS, passthrough, methods=["OPTIONS"]),  # a CORS preflight
            Route(CHAT, passthrough, methods=["OPTIONS"]),
            *(Route(path, passthrough, methods=_EVERY_METHOD) for path in PASSED_THROUGH),
            Route("/metrics", own_metrics, methods=["GET"]),
        ],
        # vLLM's server is FastAPI: a path or method it does not serve is JSON, as here
        exception_handlers={HTTPException: _http_error, ClientDisconnect: _client_left},
        middleware=[Middleware(OwnAnswers)],
    )
    app.state.worker = state
    app.state.engine = engine
    return app


def _context(request: Request) -> tuple[WorkerState, Upstream]:
    return request.app.state.worker, request.app.state.engine


async def _http_error(request: Request, exc: Exception) -> Response:
    """FastAPI's answer to a path or method no route serves: ``{"detail": ...}`` (a browser's
    CORS preflight never gets here: ``OwnAnswers`` relays it to vLLM)."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)


async def _client_left(request: Request, _: Exception) -> Response:
    """The client left before its whole body came: nothing was sent to vLLM, nobody reads
    an answer (counted, kept out of the error log)."""
    state, _engine = _context(request)
    state.metrics.requests.labels(request.url.path, "aborted").inc()
    return Response(status_code=499, headers={ANSWER_MARK: UNASKED})  # nobody reads it


async def passthrough(request: Request) -> Response:
    """A path of ``PASSED_THROUGH``, any method: vLLM's answer (its 405 to a method it does
    not serve there), with the client's headers vLLM reads."""
    _, engine = _context(request)
    return await relay(engine, request, await request.body() or None)


async def own_metrics(request: Request) -> Response:
    state, _ = _context(request)
    state.metrics.pending.set(await run_in_threadpool(state.spool.pending))
    state.metrics.dead_letters.set(await run_in_threadpool(state.spool.dead_letters))
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def replay(request: Request) -> Response:
    state, engine = _context(request)
    return await handle_replay(request, state, engine)


async def other_method(request: Request) -> Response:
    """GET and the rest on a generation path: vLLM's own answer (its JSON 405)."""
    return await forward_unchanged(request, _Unread(await request.body(), None, "method", None))


@dataclass(frozen=True)
class _Read:
    """A request read as vLLM reads it: what the engine gets, and what the record keeps."""

    request_id: str
    tier: int
    plan: Plan
    engine_raw: bytes


@dataclass(frozen=True)
class _Unread:
    """A request the collector cannot read as vLLM would: sent on as the client sent it."""

    raw: bytes
    request_id: str | None
    reason: str  # collector_unrecordable_total's label, should vLLM answer it with a 2xx
    refusal: Conflict | None  # the tier's, should vLLM answer it with a 2xx


async def _read(request: Request, state: WorkerState, request_id: str) -> _Read | _Unread:
    """What vLLM would make of the request, or that the collector cannot tell (then vLLM
    decides); a request refused on the collector's own rules raises."""
    tier = parse_tier(request.headers.get(TIER_HEADER), state.default_tier)
    raw = await request.body()
    parsed = RequestJson(None, False)
    reason = "media_type"
    if is_json_media_type(request.headers.get("content-type")):
        reason = "not_an_object"
        with contextlib.suppress(ValueError, RecursionError):  # vLLM: 400 as well
            parsed = read_request_json(raw)
    body: Any = parsed.value
    if isinstance(body, dict):
        reason = "not_judged"
        try:
            exchange_plan = plan(request.url.path, body, can_render=state.renderer is not None)
            engine_raw = parsed.engine_bytes(exchange_plan.engine_body)
            check_tier(tier, body, state.batch_invariance)
            return _Read(request_id, tier, exchange_plan, engine_raw)
        except (Unsure, UnicodeEncodeError, RecursionError, ValueError) as exc:
            logger.info("request %s forwarded unchanged: %s", request_id, exc)
    refusal = refusal_if_answered(tier, body, state.batch_invariance)
    return _Unread(raw, request_id, reason, refusal)


async def generate(request: Request) -> Response:
    """A completions or chat request: read, forwarded, answered and recorded."""
    began = time.perf_counter()
    state, engine = _context(request)
    request_id = None
    try:
        request_id = request_id_of(request)
        REQUEST_ID.set(request_id)  # this request's task: its log lines name it (ledger.logs)
        if state.fingerprint_unsure is not None:  # before the tier is judged on stale facts
            raise unsure()
        read = await _read(request, state, request_id)
        if isinstance(read, _Unread):
            return await forward_unchanged(request, read)
        if request_id in state.in_flight or state.spool.holds(request_id):
            raise Conflict(
                f"request ID {request_id!r} was already used with this collector",
                code="request_id_in_use",
            )
    except LedgerError as exc:
        state.metrics.refusals.labels(exc.code).inc()
        return error_response(exc, request_id)
    ex = Exchange.begin(state, request.url.path, request_id, read.tier, read.plan, read.engine_raw)
    state.in_flight.add(request_id)
    response: Response | None = None
    try:
        own = time.perf_counter() - began
        if read.plan.stream:
            response = await forward_stream(request, engine, ex, own)
        else:
            response = await forward_whole(request, engine, ex, own)
        return response
    finally:
        if not isinstance(response, EndsWithTheResponse):  # that one releases the ID
            state.in_flight.discard(request_id)


async def forward_unchanged(request: Request, read: _Unread) -> Response:
    """A request the collector cannot read as vLLM would (not JSON, or values it cannot
    judge): vLLM gets it as the client sent it, and the client vLLM's answer. vLLM refuses
    almost all of these; an answer it accepted is counted, never recorded, and withheld for
    the tier's refusal when the tier would not have allowed it."""
    state, engine = _context(request)
    metrics, request_id = state.metrics, read.request_id
    try:
        answer = await unless_gone(
            request,
            engine.request(
                request.method,
                request.url.path,
                body=read.raw,
                headers=engine_headers(request, request_id),
            ),
        )
    except Unreachable as exc:
        return error_response(exc, request_id)
    if answer is None:  # the client left: closing the connection stopped the engine
        metrics.requests.labels(request.url.path, "aborted").inc()
        return Response(status_code=499)
    metrics.requests.labels(request.url.path, "forwarded_unchanged").inc()
    if 200 <= answer.status < 300 and read.refusal is not None:
        metrics.refusals.labels(read.refusal.code).inc()
        return error_response(read.refusal, request_id)
    if 200 <= answer.status < 300:
        metrics.unrecordable.labels(read.reason).inc()
        logger.warning(
            "request %s: vLLM answered %d to a request the collector could not read (%s): "
            "passed through, not recorded",
            request_id,
            answer.status,
            read.reason,
        )
    else:
        metrics.engine_errors.labels(str(answer.status)).inc()
    headers = dict(answer.passed)
    if request_id is not None:
        headers[REQUEST_ID_HEADER] = request_id
    return Response(answer.body, answer.status, media_type=answer.content_type, headers=headers)


def _answer(ex: Exchange, answer: Answer, content: bytes, media_type: str | None) -> Response:
    """``content`` with vLLM's status and passed-on headers, and the request's ID."""
    return Response(
        content,
        answer.status,
        media_type=media_type,
        headers={**answer.passed, REQUEST_ID_HEADER: ex.request_id},
    )


async def _whole(request: Request, engine: Upstream, ex: Exchange) -> Answer:
    return await engine.request(
        "POST", ex.endpoint, body=ex.engine_raw, headers=engine_headers(request, ex.request_id)
    )


async def forward_whole(request: Request, engine: Upstream, ex: Exchange, own: float) -> Response:
    """A request answered at once: vLLM's answer, recorded before the client gets it. A
    client that leaves first closes the engine's connection, as it would have closed its
    own to vLLM, and vLLM aborts the generation: nothing was read, nothing is recorded."""
    metrics = ex.state.metrics
    endpoint, request_id = ex.endpoint, ex.request_id
    try:
        answer = await unless_gone(request, _whole(request, engine, ex))
    except Unreachable as exc:
        metrics.requests.labels(endpoint, "engine_unreachable").inc()
        return error_response(exc, request_id)
    if answer is None:
        metrics.requests.labels(endpoint, "aborted").inc()
        return Response(status_code=499)  # nobody reads it
    content = answer.body
    if answer.status != 200:
        metrics.engine_errors.labels(str(answer.status)).inc()
        metrics.requests.labels(endpoint, "engine_error").inc()
        return _answer(ex, answer, content, answer.content_type)
    after = time.perf_counter()
    try:
        data = engine_json(content)
    except ValueError:
        data = None
    if not isinstance(data, dict):  # not an answer of vLLM's OpenAI server: as it came
        count_unrecordable(ex, InvalidInput("the engine's answer is not a JSON object"), metrics)
        return _answer(ex, answer, content, answer.content_type)
    ex.ttft_ns = time.perf_counter_ns() - ex.started_ns
    ex.acc.feed(data)
    out = content if not ex.plan.reshapes else ex.for_client(data)
    try:
        await ex.spool_async()
    except InvalidInput as exc:
        # vLLM's answer holds nothing a record can be built from: the client gets it, and
        # /metrics counts it.
        count_unrecordable(ex, exc, metrics)
        return _answer(ex, answer, out, "application/json")
    except LedgerError as exc:
        # Fail closed: an answer that cannot be stored is not handed out.
        metrics.requests.labels(endpoint, "not_recorded").inc()
        if isinstance(exc, Conflict):  # the same request ID, sent twice at once
            return error_response(exc, request_id)
        withheld = StorageError(
            f"the answer could not be recorded, so it is withheld: {exc.message}",
            code="not_recorded",
        )
        return error_response(withheld, request_id)
    metrics.added_latency.observe(own + time.perf_counter() - after)
    metrics.requests.labels(endpoint, "recorded").inc()
    return _answer(ex, answer, out, "application/json")
