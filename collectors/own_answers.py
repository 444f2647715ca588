"""The collector's own answers as vLLM's front would give them: its API key check and CORS.

vLLM runs every request through two middlewares before any route: its API key check
(``--api-key``: a path under ``/v1``, ``/v2``, ``/inference`` or ``/cohere``, any method but
``OPTIONS``, needs ``Authorization: Bearer <key>``, else 401 with no CORS headers) and, inside
it, its CORS middleware (``--allowed-origins``, ``--allow-credentials``, ``--allowed-methods``,
``--allowed-headers``: it answers every preflight, and adds its headers, and ``Vary: Origin``,
to every other answer). What vLLM answers passes through the collector with those headers
(``upstream.passed_on`` marks it). This middleware makes the collector's own answers (its
refusals, a 404, a redirect, ``/metrics``) what vLLM's front would make of them:

- a preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``), on any path,
  goes to vLLM as it came, body unread, and vLLM's answer comes back;
- before an answer of the collector's own on a guarded path, the collector asks vLLM
  ``GET /v1/models`` with the client's ``Authorization`` and ``Origin``: when vLLM answers
  401, the client gets that 401 instead (a client vLLM would turn away learns nothing from
  the collector, a used request ID included); otherwise, and on other paths when the request
  carries ``Origin`` (asking ``GET /health``), the answer gets the CORS headers vLLM gave that
  request. Every own answer carries ``Vary: Origin``, as vLLM's do.

When vLLM does not answer the question within ``ASK_TIMEOUT`` (or at all), and on the
collector's 502 ``engine_unreachable``, an own answer goes out with no CORS headers: a browser
shows a network error, as it would with vLLM down and no collector in front.
"""

from __future__ import annotations

import asyncio

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from collectors.edge import forwarded_headers
from collectors.errors import error_response
from collectors.upstream import ANSWER_MARK, ENGINE, Answer, Upstream
from ledger.errors import Unreachable

ASK_TIMEOUT = 2.0  # seconds: a wedged engine delays the collector's own answers no longer
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")  # vLLM's API key check's paths


def is_preflight(headers: Headers, method: str) -> bool:
    """A CORS preflight, as Starlette's CORS middleware (vLLM's) tells one."""
    return (
        method == "OPTIONS" and "origin" in headers and "access-control-request-method" in headers
    )


def is_guarded(scope: Scope) -> bool:
    """A request vLLM's API key check reads (when vLLM has a key)."""
    path: str = scope["path"].removeprefix(scope.get("root_path", ""))
    return scope["method"] != "OPTIONS" and path.startswith(GUARDED_PREFIX)


class OwnAnswers:
    """ASGI middleware: the collector's own answers as vLLM's front makes them (the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        engine: Upstream = scope["app"].state.engine
        request = Request(scope, receive)
        replaced = False

        async def as_vllm(message: Message) -> None:
            nonlocal replaced
            if replaced:  # the app's own body, after vLLM's 401 went out in its place
                return
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                mark = headers.get(ANSWER_MARK)
                if mark is not None:
                    del headers[ANSWER_MARK]
                if mark != ENGINE:
                    headers.append("vary", "Origin")
                if mark is None:
                    asked = await _ask(engine, request)
                    if asked is not None and asked.status == 401 and is_guarded(scope):
                        replaced = True
                        await _response(asked)(scope, receive, send)
                        return
                    for name, value in (asked.passed if asked is not None else {}).items():
                        if name.startswith("access-control-"):
                            headers[name] = value
            await send(message)

        if is_preflight(request.headers, scope["method"]):
            await (await relay(engine, request))(scope, receive, as_vllm)
        else:
            await self.app(scope, receive, as_vllm)


def _response(answer: Answer) -> Response:
    """vLLM's answer as it came (the headers that pass on, unmarked)."""
    headers = {k: v for k, v in answer.passed.items() if k != ANSWER_MARK}
    return Response(answer.body, answer.status, media_type=answer.content_type, headers=headers)


async def relay(engine: Upstream, request: Request, body: bytes | None = None) -> Response:
    """vLLM's answer to this request sent on as it came (its method, path with query, the
    headers vLLM reads and ``body``), marked as vLLM's; the collector's 502 when vLLM does not
    answer. A preflight is relayed with no body: vLLM's CORS middleware reads none."""
    path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    try:
        answer = await engine.request(
            request.method, path, body=body, headers=forwarded_headers(request)
        )
    except Unreachable as exc:
        return error_response(exc)
    return Response(
        answer.body, answer.status, media_type=answer.content_type, headers=dict(answer.passed)
    )


async def _ask(engine: Upstream, request: Request) -> Answer | None:
    """vLLM's answer to the question this request's own answer needs (None when none is
    needed, or vLLM gives none in time): ``GET /v1/models`` with the client's credentials and
    origin on a guarded path, ``GET /health`` with its origin on another path."""
    guarded = is_guarded(request.scope)
    origin = request.headers.get("origin")
    if not guarded and origin is None:
        return None
    headers = {"origin": origin} if origin is not None else {}
    credentials = request.headers.get("authorization")
    if guarded and credentials is not None:
        headers["authorization"] = credentials
    try:
        return await asyncio.wait_for(
            engine.request("GET", "/v1/models" if guarded else "/health", headers=headers),
            ASK_TIMEOUT,
        )
    except (Unreachable, TimeoutError):
        return None
