"""The one place where errors become HTTP responses: ``{"error": {"code", "message"}}``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledger.errors import (
    AuthenticationError,
    Conflict,
    Gone,
    IndexMismatch,
    InvalidInput,
    LedgerError,
    NotFound,
    PermissionDenied,
    Pushback,
    StorageError,
    TooLarge,
    Unreachable,
    VerificationError,
)

logger = logging.getLogger("ledger.api")


class BodyTimeout(LedgerError):
    """The client did not send its request body within LEDGER_BODY_TIMEOUT (``api.gate``)."""

    code = "body_timeout"


# Most specific first.
STATUS: list[tuple[type[LedgerError], int]] = [
    (BodyTimeout, 408),
    (TooLarge, 413),
    (InvalidInput, 422),
    (VerificationError, 422),
    (AuthenticationError, 401),
    (PermissionDenied, 403),
    (NotFound, 404),
    (Conflict, 409),
    (Gone, 410),
    (Pushback, 503),
    (StorageError, 503),
    (Unreachable, 502),
    (IndexMismatch, 500),  # the database disagrees with the log: `ledger audit` says where
]
# Input errors that mean "this is not JSON at all" rather than "this JSON is wrong".
BAD_REQUEST_CODES = {"invalid_json"}

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "body_timeout",
    413: "too_large",
    415: "unsupported_media_type",
}


def status_for(exc: LedgerError) -> int:
    if exc.code in BAD_REQUEST_CODES:
        return 400
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_response(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if extra.get("details"):
        body["details"] = extra["details"]
    headers = extra.get("headers")
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def ledger_error_response(exc: LedgerError) -> JSONResponse:
    """The answer to a domain error (the exception handler's, and the gate's before the app)."""
    status = status_for(exc)
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, Pushback):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    elif isinstance(exc, StorageError):
        headers["Retry-After"] = "1"
    return error_response(
        status, exc.code, exc.message, details=exc.details, headers=headers or None
    )


def allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (the router's 405 names only one route's)."""
    methods: set[str] = set()
    for route in iter_route_contexts(request.app.router.routes):
        found, _ = route.matches(request.scope)
        if found is not Match.NONE:
            methods |= route.methods or set()
    if "GET" in methods:  # api.head answers HEAD wherever GET is served
        methods.add("HEAD")
    return ", ".join(sorted(methods))


# The console's pages answer errors as pages: ``(request, status, code, message) -> Response``
# (``api.ui.routes.error_page``), for every path under PAGES_PREFIX; the status is the API's.
PageRenderer = Callable[[Request, int, str, str], Response]
PAGES_PREFIX = "/ui/"


def console_path(path: str) -> bool:
    """Whether ``path`` is the console's (its answers carry the console's headers)."""
    return path.startswith(PAGES_PREFIX) or path == PAGES_PREFIX[:-1]


def install(
    app: FastAPI, pages: PageRenderer | None = None, page_headers: Mapping[str, str] | None = None
) -> None:
    """Map errors to answers. Under PAGES_PREFIX an error is a page (``pages``), or for a
    download path or a 405 the JSON answer; either way with ``page_headers`` (the console's
    security headers: a download's error is no less the console's answer)."""

    def in_console(request: Request) -> bool:
        return pages is not None and console_path(request.url.path)

    def as_page(request: Request) -> PageRenderer | None:
        if not in_console(request) or request.url.path.endswith((".json", ".csv", ".ndjson")):
            return None
        return pages

    def answered(request: Request, response: Response) -> Response:
        if page_headers and in_console(request):
            response.headers.update(page_headers)
        return response

    @app.exception_handler(LedgerError)
    async def _ledger_error(request: Request, exc: LedgerError) -> Response:
        request.state.error_code = exc.code
        if page := as_page(request):
            return page(request, status_for(exc), exc.code, exc.message)
        return answered(request, ledger_error_response(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        msg = f"{where}: {first.get('msg', 'invalid')}" if where else "request is invalid"
        request.state.error_code = "schema_violation"
        if page := as_page(request):
            return page(request, 422, "schema_violation", msg)
        details = {"errors": [{"loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in errors]}
        return answered(request, error_response(422, "schema_violation", msg, details=details))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        request.state.error_code = "internal_error"
        if page := as_page(request):
            return page(request, 500, "internal_error", "internal error; it has been logged")
        return answered(
            request, error_response(500, "internal_error", "internal error; it has been logged")
        )

    app.state.unexpected_error = _unexpected

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        request.state.error_code = code
        if (page := as_page(request)) and exc.status_code != 405:
            return page(request, exc.status_code, code, str(exc.detail))
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(request)
        return answered(
            request,
            error_response(exc.status_code, code, str(exc.detail), headers=headers or None),
        )


class UnexpectedErrors:
    """An unhandled exception answered as the JSON 500 inside ``RequestIds``, not by
    Starlette's outermost handler: so the answer carries the request's ID and so does the
    traceback's log line, and the exception is not raised on to the server, which would drop
    the connection (and any request pipelined on it) without a word."""

    def __init__(self, app: ASGIApp, handler: Callable[[Request, Exception], Any]) -> None:
        self.app, self.handler = app, handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:  # part of an answer went out: nothing sound can follow it
                raise
            response = await self.handler(Request(scope), exc)
            await response(scope, receive, send)
