"""Bearer tokens in the database (hashes only)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, insert, select, update

from ledger.errors import AuthenticationError, InvalidInput, NotFound
from ledger.storage.database import Database, as_utc, utcnow
from ledger.storage.models import ApiToken
from ledger.tokens import Principal, hash_token, new_token, parse_scopes, token_display_id


@dataclass(frozen=True)
class TokenInfo:
    token_id: str
    name: str
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None


def create_token(db: Database, name: str, scopes: list[str] | str) -> tuple[str, TokenInfo]:
    """Create a token; the secret is returned once and never stored."""
    parsed = parse_scopes(scopes)
    if not name or len(name) > 100:
        raise InvalidInput("token name must be 1-100 characters", code="schema_violation")
    secret = new_token()
    info = TokenInfo(token_display_id(secret), name, parsed, utcnow(), None)
    with db.write() as s:
        s.execute(
            insert(ApiToken),
            [
                {
                    "token_id": info.token_id,
                    "token_hash": hash_token(secret),
                    "name": name,
                    "scopes": ",".join(parsed),
                    "created_at": info.created_at,
                    "revoked_at": None,
                }
            ],
        )
    return secret, info


def count_tokens(db: Database) -> int:
    with db.read() as s:
        return int(s.execute(select(func.count()).select_from(ApiToken)).scalar_one())


def list_tokens(db: Database) -> list[TokenInfo]:
    with db.read() as s:
        rows = s.execute(select(ApiToken).order_by(ApiToken.created_at)).scalars().all()
    return [_info(r) for r in rows]


def revoke_token(db: Database, token_id: str) -> TokenInfo:
    with db.write() as s:
        row = s.get(ApiToken, token_id)
        if row is None:
            raise NotFound(f"no token {token_id}", code="token_not_found")
        if row.revoked_at is None:
            s.execute(
                update(ApiToken).where(ApiToken.token_id == token_id).values(revoked_at=utcnow())
            )
            row = s.get(ApiToken, token_id, populate_existing=True)
            assert row is not None
        return _info(row)


def authenticate(db: Database, secret: str) -> Principal:
    with db.read() as s:
        row = s.execute(
            select(ApiToken).where(ApiToken.token_hash == hash_token(secret))
        ).scalar_one_or_none()
    if row is None or row.revoked_at is not None:
        raise AuthenticationError("the bearer token is not valid", code="invalid_token")
    return Principal(row.token_id, row.name, tuple(row.scopes.split(",")))


def _info(row: ApiToken) -> TokenInfo:
    return TokenInfo(
        row.token_id,
        row.name,
        tuple(row.scopes.split(",")),
        as_utc(row.created_at),
        as_utc(row.revoked_at) if row.revoked_at else None,
    )
