"""``POST /v1/cache/lookup`` without the framework, for answers this process verifies itself.

A cache lookup is worth having only when it takes about a millisecond; the framework's routing
and dependency resolution took most of that here. This ASGI middleware sits inside the gate
(which has checked the token, its ``cache:read`` scope and the body's size) and answers a lookup
itself when, and only when, :func:`ledger.storage.cache_lookup.kept_answer` has an answer: one
verified against the log before, whose key's index rows read now are those it was verified
through, or (a key's first lookup, on Postgres) one verified now from the key's rows read in one
statement with their log entries and content. The body is read as the route reads it (strict
JSON, the same model), and only a body of up to 64 KiB (parsed and keyed on the event loop);
anything else, a refusal included, goes on to the route with the body replayed, so every error
and every other answer comes from one place. The answer is the route's
(:func:`api.routes.cache.render_answer`).
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.body import LOOP_BODY, content_type_problem, parse_json, validate_model
from api.routes.cache import render_answer
from api.schemas import CacheLookupRequest
from api.state import AppState
from ledger.errors import LedgerError
from ledger.storage.cache_lookup import AsyncRows, kept_answer

PATH = "/v1/cache/lookup"


class CacheFastPath:
    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app, self.state = app, state
        self.rows = AsyncRows(state.db)
        state.cache_rows = self.rows  # closed with the app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] != PATH
            or "principal" not in scope.get("state", {})  # the gate let it through
            or not _json(scope)
        ):
            await self.app(scope, receive, send)
            return
        body = await _body(receive)
        # parsed and keyed on the event loop: a large body (a long prompt) goes to the route,
        # which does both on a worker thread
        if len(body) <= LOOP_BODY and await self._answer(body, send):
            return
        await self.app(scope, _replay(body, receive), send)

    async def _answer(self, body: bytes, send: Send) -> bool:
        try:
            payload = validate_model(CacheLookupRequest, parse_json(body))
        except (LedgerError, RequestValidationError):
            return False  # the route answers the refusal
        context: dict[str, Any] = {"pool": payload.pool}
        fingerprint_id = payload.fingerprint_id
        if payload.pool is not None:
            contract = self.state.pool_contracts.kept(payload.pool)
            if contract is None or fingerprint_id is not None:
                return False
            fingerprint_id = contract.fingerprint_id
            context["pool_fingerprint_ids"] = list(contract.fingerprint_ids)
        if fingerprint_id is None:
            return False
        try:
            found = await kept_answer(
                self.rows,
                self.state.hot_answers,
                payload.endpoint,
                payload.request,
                fingerprint_id,
                prompt_token_ids=payload.prompt_token_ids,
                pool=payload.pool,
            )
        except LedgerError:
            return False
        if found is None:
            return False
        self.state.metrics.cache_lookups.labels(found.outcome, found.via).inc()
        await render_answer(found, context, payload)({"type": "http"}, _no_receive, send)
        return True


def _json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value == b"application/json" or (
                content_type_problem(value.decode("latin-1")) is None
            )
    return True


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
