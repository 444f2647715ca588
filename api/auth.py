"""Bearer-token authentication and scope checks, as FastAPI dependencies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from api.state import AppState, StateDep
from ledger.errors import AuthenticationError, PermissionDenied
from ledger.storage import tokenstore
from ledger.tokens import Principal


async def principal_for(state: AppState, header: str) -> Principal:
    """The principal of an ``Authorization`` header value (shared by the dependency below and
    the gate, ``api.gate``, which checks it before a body is read)."""
    scheme, _, token = header.partition(" ")
    if not header:
        raise AuthenticationError(
            "authentication required: send 'Authorization: Bearer <token>'", code="missing_token"
        )
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError(
            "the Authorization header must be 'Bearer <token>'", code="invalid_token"
        )
    secret = token.strip()
    principal = state.token_cache.get(secret)
    if principal is None:
        principal = await run_in_threadpool(tokenstore.authenticate, state.db, secret)
        state.token_cache.put(secret, principal)
    return principal


async def authenticate(request: Request, state: StateDep) -> Principal:
    principal: Principal | None = getattr(request.state, "principal", None)  # set by the gate
    if principal is None:
        principal = await principal_for(state, request.headers.get("authorization", ""))
        request.state.principal = principal
    return principal


# Scopes that a broader one grants too (``admin`` grants every scope): a token that may read
# records may read cache keys and hits, which are records.
IMPLIED_BY = {"cache:read": ("records:read",)}


def check_scope(principal: Principal, scope: str) -> Principal:
    if not any(principal.allows(s) for s in (scope, *IMPLIED_BY.get(scope, ()))):
        raise PermissionDenied(
            f"this token lacks the {scope!r} scope (it has {list(principal.scopes)})",
            code="insufficient_scope",
            details={"required": scope},
        )
    return principal


def require(scope: str) -> Callable[..., object]:
    """Dependency factory: the caller's token must carry ``scope`` (or ``admin``). The gate
    reads ``required_scope`` to check it before the body."""

    async def _check(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        return check_scope(principal, scope)

    _check.required_scope = scope  # type: ignore[attr-defined]
    return _check


ReadRecords = Annotated[Principal, Depends(require("records:read"))]
ReadCache = Annotated[Principal, Depends(require("cache:read"))]  # or records:read
WriteRecords = Annotated[Principal, Depends(require("records:write"))]
ReplayScope = Annotated[Principal, Depends(require("replay"))]
EraseScope = Annotated[Principal, Depends(require("erasure"))]
HoldsScope = Annotated[Principal, Depends(require("holds"))]
Admin = Annotated[Principal, Depends(require("admin"))]
