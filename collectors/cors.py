"""A browser's view of the collector: the CORS answers vLLM alone would give.

vLLM's CORS middleware (configured by its ``--allowed-origins``, ``--allow-credentials``,
``--allowed-methods`` and ``--allowed-headers``) answers every preflight before routing, and
adds its headers to every answer of a request that carries ``Origin``. The answers of vLLM's
that the collector passes on carry them already (``upstream.passed_on``). This middleware
covers the rest, so a browser is allowed, or refused, what vLLM alone would allow it:

- a preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``), on any path,
  goes to vLLM, whose answer comes back as it is;
- an answer of the collector's own (a refusal, a 404, a redirect, ``/metrics``) to a request
  with ``Origin`` gets the headers vLLM gives that origin. The collector learns them by asking
  vLLM (``GET /health`` with the same ``Origin``), and remembers them for a few seconds per
  origin, so the policy is vLLM's own however it was configured. An answer that carries an
  ``Access-Control-*`` header, or a ``Vary`` naming ``Origin``, is vLLM's and is left alone.

When vLLM cannot be reached, or does not answer within ``ASK_TIMEOUT``, the collector's answer
goes out without them: a browser shows a network error, as it would with vLLM down and no
collector in front.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from collectors.upstream import Upstream
from ledger.errors import Unreachable

REMEMBERED_SECONDS = 10.0
ASK_TIMEOUT = 2.0  # seconds: a wedged engine delays the collector's own answers no longer
_MAX_ORIGINS = 256  # distinct origins remembered at once (a browser sends one)
_ASKED = "/health"

Preflight = Callable[[Request], Awaitable[Response]]


def is_preflight(headers: Headers, method: str) -> bool:
    """A CORS preflight, as Starlette's CORS middleware (vLLM's) tells one."""
    return (
        method == "OPTIONS" and "origin" in headers and "access-control-request-method" in headers
    )


def _vllms(headers: MutableHeaders) -> bool:
    """Whether an answer carries vLLM's CORS answer already."""
    if any(name.startswith("access-control-") for name in headers):
        return True
    return any("origin" in value.lower() for value in headers.getlist("vary"))


class EngineCors:
    """ASGI middleware: the engine's CORS answer on every answer (see the module)."""

    def __init__(self, app: ASGIApp, preflight: Preflight) -> None:
        self.app = app
        self.preflight = preflight
        self._known: dict[str, tuple[float, dict[str, str]]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, send)
            return
        if is_preflight(headers, scope["method"]):
            response = await self.preflight(Request(scope, receive))
            await response(scope, receive, send)
            return
        engine: Upstream = scope["app"].state.engine

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                answer = MutableHeaders(scope=message)
                if not _vllms(answer):
                    for name, value in (await self._headers(engine, origin)).items():
                        if name == "vary":
                            answer.append("vary", value)
                        else:
                            answer[name] = value
            await send(message)

        await self.app(scope, receive, with_cors)

    async def _headers(self, engine: Upstream, origin: str) -> dict[str, str]:
        """The CORS headers vLLM gives ``origin`` (none when it cannot be asked)."""
        now = time.monotonic()
        known = self._known.get(origin)
        if known is not None and known[0] > now:
            return known[1]
        try:
            answer = await asyncio.wait_for(
                engine.request("GET", _ASKED, headers={"origin": origin}), ASK_TIMEOUT
            )
        except (Unreachable, TimeoutError):
            return {}  # not remembered: the next answer asks again
        given: dict[str, Any] = {k: v for k, v in answer.passed.items() if k != "allow"}
        if len(self._known) >= _MAX_ORIGINS:
            self._known.clear()
        self._known[origin] = (now + REMEMBERED_SECONDS, given)
        return given
