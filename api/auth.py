"""Bearer-token authentication and scope checks, as FastAPI dependencies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from api.state import AppState, get_state
from ledger.errors import AuthenticationError, PermissionDenied
from ledger.storage import tokenstore
from ledger.tokens import Principal


async def authenticate(
    request: Request, state: Annotated[AppState, Depends(get_state)]
) -> Principal:
    header = request.headers.get("authorization", "")
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
    request.state.principal = principal
    return principal


def require(scope: str) -> Callable[..., object]:
    """Dependency factory: the caller's token must carry ``scope`` (or ``admin``)."""

    async def _check(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        if not principal.allows(scope):
            raise PermissionDenied(
                f"this token lacks the {scope!r} scope (it has {list(principal.scopes)})",
                code="insufficient_scope",
                details={"required": scope},
            )
        return principal

    return _check


ReadRecords = Annotated[Principal, Depends(require("records:read"))]
WriteRecords = Annotated[Principal, Depends(require("records:write"))]
ReplayScope = Annotated[Principal, Depends(require("replay"))]
Admin = Annotated[Principal, Depends(require("admin"))]
