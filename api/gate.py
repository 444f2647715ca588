"""The gate: credentials, scope and body limits, settled before the app reads a byte of a body.

FastAPI parses a route's body parameters before it runs the route's dependencies, so a
token check written as a dependency comes after the body has been read. This pure ASGI
middleware sits in front of the router and, for every request:

1. finds the route the router will pick (the same ``matches`` in the same order) and what it
   requires, read from its dependencies: any route that depends on ``api.auth.authenticate``
   is protected, and a ``require(scope)`` among them names its scope. Public routes
   (``/healthz``, ``/metrics``, ``/v1/log/key``, the OpenAPI document and ``/docs``) have
   neither;
2. on a protected route, authenticates the bearer token (``api.auth.principal_for``: the
   same logic and token cache as the dependency, which then reuses the principal) and checks
   the scope: 401 or 403 before the body is read;
   then, on an API route (``/v1/``), refuses a query parameter the route does not declare, one
   given twice where the route takes one value, and an integer that is not written as one
   (``1.0``): 422 ``schema_violation``, as a body member would be (a misspelt search filter
   otherwise answers an unfiltered page);
3. refuses a declared ``Content-Length`` over ``LEDGER_MAX_BODY_BYTES`` (413 ``body_too_large``);
4. counts body bytes as the app receives them, on every route and for chunked bodies too:
   413 ``body_too_large`` as soon as the count passes the limit;
5. bounds the time a body may take: once ``LEDGER_BODY_TIMEOUT`` seconds have passed since
   the app began to read it and its last byte has not come, 408 ``body_timeout``.

A refusal the gate answers itself (the app's own later answer, if any, is dropped), and any
answer sent while part of a request's body is still unread says ``Connection: close``: the
server never waits for, nor reads, the rest. The gate adds no copy of a body; it only counts
the chunks the app reads.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args, get_origin
from urllib.parse import parse_qsl

from fastapi.routing import RouteContext, iter_route_contexts
from starlette.routing import BaseRoute, Match, Mount, get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import errors
from api.auth import authenticate, check_scope, principal_for
from api.state import AppState
from ledger.errors import InvalidInput, LedgerError, TooLarge


@dataclass(frozen=True)
class Rule:
    """What a route requires before its body may be read."""

    context: RouteContext  # the route as the router matches it (path, methods, dependencies)
    protected: bool
    scope: str | None
    # A route's own match is a chain of lookups and a child scope (~10 us); the gate matches
    # on the same path pattern and methods directly. None: a route kind without them.
    regex: re.Pattern[str] | None
    methods: frozenset[str] | None
    # The query parameters an API route declares, by name: "int", "list" or "str"; None where
    # the query is not checked (routes outside /v1/).
    query: dict[str, str] | None = None

    @property
    def route(self) -> BaseRoute:
        return self.context.original_route


def rule_for(context: RouteContext) -> Rule:
    """Read a route's requirements from its dependency tree."""
    protected, scope = False, None
    dependant = getattr(context, "dependant", None)  # only FastAPI routes have one
    stack = list(dependant.dependencies) if dependant is not None else []
    query: dict[str, str] = {}
    if dependant is not None:
        query.update(_query_kinds(dependant.query_params))
    while stack:
        dep = stack.pop()
        if dep.call is authenticate:
            protected = True
        required = getattr(dep.call, "required_scope", None)
        if isinstance(required, str):
            protected, scope = True, required
        query.update(_query_kinds(dep.query_params))
        stack.extend(dep.dependencies)
    regex = getattr(context, "path_regex", None)
    methods = getattr(context, "methods", None)
    if not isinstance(regex, re.Pattern) or not methods:
        regex = methods = None
    checked = dependant is not None and context.path_format.startswith("/v1/")
    return Rule(
        context,
        protected,
        scope,
        regex,
        frozenset(methods) if methods else None,
        query if checked else None,
    )


def _query_kinds(fields: Sequence[Any]) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for f in fields:
        annotation = f.field_info.annotation
        args = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
        if any(a is list or get_origin(a) is list for a in args):
            kinds[f.alias] = "list"
        elif any(a is bool for a in args):
            kinds[f.alias] = "bool"
        elif any(a is int for a in args):
            kinds[f.alias] = "int"
        else:
            kinds[f.alias] = "str"
    return kinds


_INTEGER = re.compile(r"-?[0-9]+")  # as JSON writes one: no sign +, no space, no point


def query_problem(declared: dict[str, str], query_string: bytes) -> LedgerError | None:
    """Why a query string does not fit the parameters a route declares; None when it does."""
    seen: set[str] = set()
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        kind = declared.get(name)
        problem = None
        if kind is None:
            problem = f"unknown query parameter {name[:100]!r}"
            if declared:
                problem += f" (this route takes {', '.join(sorted(declared))})"
        elif name in seen and kind != "list":
            problem = f"query parameter {name!r} is given more than once"
        elif kind == "int" and not _INTEGER.fullmatch(value):
            problem = f"query parameter {name!r} must be an integer, got {value[:40]!r}"
        elif kind == "bool" and value not in ("true", "false"):
            problem = f"query parameter {name!r} must be true or false, got {value[:40]!r}"
        if problem is not None:
            return InvalidInput(
                problem,
                code="schema_violation",
                details={"errors": [{"loc": ["query", name[:100]], "msg": problem}]},
            )
        seen.add(name)
    return None


_MATCHED_MAX = 4096
# Paths kept in the match cache are at most this long (a request ID's route is about 230
# characters at most): requests are matched before their token is checked, and 4096 paths of
# 64 KiB each would hold 256 MiB for anyone who sends them.
_MATCHED_PATH_MAX = 300


class RouteRules:
    """The rules of an app's routes, matched as its router matches them (first full match)."""

    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        self.rules = [rule_for(c) for c in iter_route_contexts(routes)]
        # Matches decided by pattern and method alone (so by the path and method alone), by
        # (method, path): the scan over every route costs tens of microseconds a request.
        self._matched: dict[tuple[str, str], Rule] = {}

    def match(self, scope: Scope) -> Rule | None:
        path, method = get_route_path(scope), scope["method"]
        rule = self._matched.get((method, path))
        if rule is not None:
            return rule
        by_path = True  # every route scanned so far matches by pattern and method
        for rule in self.rules:
            if rule.regex is None or rule.methods is None:
                # A mount matches by its path prefix alone; other kinds may look further.
                by_path = by_path and isinstance(rule.route, Mount)
                found, _ = rule.context.matches(scope)
                if found is Match.FULL:
                    return rule
            elif method in rule.methods and rule.regex.match(path):
                if by_path and len(path) <= _MATCHED_PATH_MAX:
                    if len(self._matched) >= _MATCHED_MAX:
                        self._matched.clear()
                    self._matched[(method, path)] = rule
                return rule
        return None


class _Refused(Exception):
    """Raised into the app after the gate has answered; the gate swallows it."""


def _declared_length(scope: Scope) -> tuple[int | None, bool]:
    """The request's Content-Length (None if absent) and whether it has a body at all."""
    length, chunked = None, False
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                length = None
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked or bool(length)


class _Exchange:
    """One request as the gate sees it: the body read so far and the answer sent so far."""

    def __init__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        limit: int,
        timeout: float,
        headers: Mapping[str, str],
    ) -> None:
        self.scope, self._receive, self._send = scope, receive, send
        self.limit, self.timeout = limit, timeout
        self.headers = headers  # added to the gate's own answers (the console's)
        self.declared, self.has_body = _declared_length(scope)
        self.size = 0
        self.body_done = not self.has_body
        self.started = False  # the app (or the gate) has started the response
        self.refused: str | None = None  # the code of the gate's own answer
        # The body deadline: one timer per request, armed at the first read (a timeout
        # context around every chunk's read would cost more than the read).
        self._timer: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Task[object] | None = None  # the task blocked in a read
        self.expired = False

    def _expire(self) -> None:
        self.expired = True
        if self._waiter is not None:
            self._waiter.cancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _time_out(self) -> None:
        await self.refuse(
            errors.BodyTimeout(
                "the request body did not arrive in time; the connection is closed",
                details={"timeout_seconds": self.timeout},
            )
        )
        raise _Refused

    async def receive(self) -> Message:
        if self.body_done or self.refused:
            return await self._receive()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.timeout, self._expire)
        if self.expired:
            await self._time_out()
        task = asyncio.current_task()
        self._waiter = task
        try:
            message = await self._receive()
        except asyncio.CancelledError:
            if not self.expired or task is None:
                raise  # a cancellation of our own making is a timeout; any other is not
            task.uncancel()
            await self._time_out()
        finally:
            self._waiter = None
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            if self.size > self.limit:
                await self.refuse(too_large(self.limit))
                raise _Refused
            if not message.get("more_body", False):
                self.body_done = True
                self.close()
        else:  # http.disconnect: nothing more will come
            self.body_done = True
            self.close()
        return message

    async def send(self, message: Message) -> None:
        if self.refused:  # the gate has answered: the app's late answer goes nowhere
            return
        if message["type"] == "http.response.start":
            self.started = True
            if not self.body_done:  # the rest of the body is never read: do not wait for it
                message = {
                    **message,
                    "headers": [*message.get("headers", ()), (b"connection", b"close")],
                }
        await self._send(message)

    async def refuse(self, exc: LedgerError) -> None:
        """Answer with ``exc`` unless the app has begun its own answer."""
        if self.started:
            return
        response = errors.ledger_error_response(exc)
        response.headers.update(self.headers)
        self.refused = exc.code
        self.started = True
        if not self.body_done:
            response.headers["connection"] = "close"
        await response(self.scope, self._receive, self._send)


def too_large(limit: int, declared: int | None = None) -> TooLarge:
    size = f"of {declared} bytes " if declared is not None else ""
    return TooLarge(
        f"body {size}exceeds the limit of {limit} bytes",
        code="body_too_large",
        details={"limit": limit},
    )


class Gate:
    """Pure ASGI middleware; see the module docstring. ``routes`` is the app's route list;
    ``console_headers`` go on the gate's answers under the console's paths, as on the
    console's own (``api.errors``)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        routes: list[BaseRoute],
        state: AppState,
        console_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.app, self.routes, self.state = app, routes, state
        self.console_headers = dict(console_headers or {})
        self._rules: RouteRules | None = None

    @property
    def rules(self) -> RouteRules:
        if self._rules is None:  # routes are complete once the app serves its first request
            self._rules = RouteRules(self.routes)
        return self._rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = self.state.settings
        state = scope.setdefault("state", {})
        headers = self.console_headers if errors.console_path(scope["path"]) else {}
        exchange = _Exchange(
            scope, receive, send, settings.max_body_bytes, settings.body_timeout, headers
        )
        rule = self.rules.match(scope)
        if rule is not None:
            scope["route"] = rule.route  # for the metrics of a refusal; the router sets it too
        try:
            if rule is not None and rule.protected:
                header = ""
                for name, value in scope["headers"]:
                    if name == b"authorization":
                        header = value.decode("latin-1")
                        break
                principal = await principal_for(self.state, header)
                if rule.scope is not None:
                    check_scope(principal, rule.scope)
                state["principal"] = principal
            if rule is not None and rule.query is not None and scope["query_string"]:
                problem = query_problem(rule.query, scope["query_string"])
                if problem is not None:
                    raise problem
            if exchange.declared is not None and exchange.declared > exchange.limit:
                raise too_large(exchange.limit, exchange.declared)
        except LedgerError as exc:
            await exchange.refuse(exc)
            state["error_code"] = exc.code
            return
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except _Refused:
            pass
        finally:
            exchange.close()
            if exchange.refused:
                state["error_code"] = exchange.refused
