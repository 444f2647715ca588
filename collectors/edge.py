"""The client's side of an exchange: its request ID, the headers vLLM gets, its going away.

- :func:`request_id_of`: the client's ``X-Request-ID`` (an empty one counts as none) or a new
  one; the ledger serves records at ``/v1/records/{ID}``, so an ID is 1-200 URL-safe
  characters and never a path segment trick (``.``, ``..``).
- :func:`engine_headers`: what the engine sees of the client's headers (credentials, content
  type, accept, a browser's origin and CORS preflight) plus the request ID, as vLLM alone
  would have got them.
- :func:`unless_gone`: the engine's work, cancelled when the client disconnects first, which
  closes the engine's connection, so vLLM aborts the generation as it would for the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from ledger.errors import InvalidInput, LedgerError

REQUEST_ID_HEADER = "x-request-id"
# Credentials, the body's type, and what vLLM's CORS middleware reads (a browser's origin and
# a preflight's questions): nothing else of the client's changes what vLLM answers.
FORWARD_HEADERS = (
    "authorization",
    "content-type",
    "accept",
    "origin",
    "access-control-request-method",
    "access-control-request-headers",
    "access-control-request-private-network",
)
_REQUEST_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
_PATH_TRICKS = frozenset({".", ".."})

T = TypeVar("T")


def request_id_of(request: Request) -> str:
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


def forwarded_headers(request: Request) -> dict[str, str]:
    """The client's headers that vLLM reads (``FORWARD_HEADERS``), as the engine should see them."""
    return {h: request.headers[h] for h in FORWARD_HEADERS if h in request.headers}


def engine_headers(request: Request, request_id: str | None) -> dict[str, str]:
    """:func:`forwarded_headers` and the request ID (none when ``request_id`` is None)."""
    headers = forwarded_headers(request)
    if request_id is not None:
        headers[REQUEST_ID_HEADER] = request_id
    return headers


async def unless_gone(request: Request, work: Awaitable[T]) -> T | None:
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
