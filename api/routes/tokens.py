"""``GET /v1/tokens/self``: what the ledger makes of the token a request carries."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from api.auth import authenticate
from api.schemas import ERRORS, TokenSelf
from ledger.clock import rfc3339
from ledger.tokens import Principal

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=ERRORS)


@router.get(
    "/self",
    response_model=TokenSelf,
    summary="The token this request carries",
    description=(
        "Any valid token: its display ID, name, scopes and expiry. An unknown or revoked token "
        "is 401 `invalid_token`, an expired one 401 `token_expired`. `ledger collect` asks it "
        "before it starts, so a token the ledger refuses is named at once."
    ),
)
async def token_self(principal: Annotated[Principal, Depends(authenticate)]) -> dict[str, object]:
    return {
        "token_id": principal.token_id,
        "name": principal.name,
        "scopes": list(principal.scopes),
        "expires_at": rfc3339(principal.expires_at) if principal.expires_at else None,
    }
