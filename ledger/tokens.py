"""API bearer tokens: generation, hashing and scopes. Only a token's hash is stored."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from ledger.errors import InvalidInput

SCOPES = ("records:write", "records:read", "cache:read", "replay", "admin")
TOKEN_PREFIX = "lgr_"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_display_id(token: str) -> str:
    """A short public handle for a token (its hash prefix), safe to print and log."""
    return hash_token(token)[7:19]


def parse_scopes(scopes: list[str] | tuple[str, ...] | str) -> tuple[str, ...]:
    items = scopes.split(",") if isinstance(scopes, str) else list(scopes)
    cleaned = tuple(sorted({s.strip() for s in items if s.strip()}))
    if not cleaned:
        raise InvalidInput("at least one scope is required", code="invalid_scope")
    unknown = [s for s in cleaned if s not in SCOPES]
    if unknown:
        raise InvalidInput(
            f"unknown scope(s) {unknown}; known: {list(SCOPES)}", code="invalid_scope"
        )
    return cleaned


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's display ID, name and scopes."""

    token_id: str
    name: str
    scopes: tuple[str, ...]

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes
