"""Bearer tokens in the database (hashes only), with optional expiry."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import delete, func, insert, select, update

from ledger.clock import rfc3339
from ledger.errors import AuthenticationError, InvalidInput, NotFound
from ledger.names import MAX_NAME, is_name
from ledger.storage.database import Database, as_utc, utcnow
from ledger.storage.models import ApiToken
from ledger.tokens import (
    Principal,
    check_expiry,
    hash_token,
    new_token,
    parse_scopes,
    token_display_id,
)


@dataclass(frozen=True)
class TokenInfo:
    token_id: str
    name: str
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None = None

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at


@dataclass(frozen=True)
class NewToken:
    """A validated token not yet stored: its secret (shown or written once) and its info."""

    secret: str = field(repr=False)
    info: TokenInfo


def prepare_token(
    name: str, scopes: list[str] | str, expires_at: datetime | None = None
) -> NewToken:
    """Validate and generate a token without storing it, so a caller can first make sure its
    secret can be kept (staged in a file) and store it only then (:func:`store_token`)."""
    parsed = parse_scopes(scopes)
    if not is_name(name):
        raise InvalidInput(
            f"token name must be 1-{MAX_NAME} characters of visible text (not only spaces), "
            "without control or invisible format characters",
            code="schema_violation",
        )
    now = utcnow()
    if expires_at is not None:
        check_expiry(expires_at, now)
    secret = new_token()
    return NewToken(
        secret, TokenInfo(token_display_id(secret), name, parsed, now, None, expires_at)
    )


def store_token(db: Database, token: NewToken) -> TokenInfo:
    info = token.info
    with db.write() as s:
        s.execute(
            insert(ApiToken),
            [
                {
                    "token_id": info.token_id,
                    "token_hash": hash_token(token.secret),
                    "name": info.name,
                    "scopes": ",".join(info.scopes),
                    "created_at": info.created_at,
                    "revoked_at": None,
                    "expires_at": info.expires_at,
                }
            ],
        )
    return info


def create_token(
    db: Database, name: str, scopes: list[str] | str, expires_at: datetime | None = None
) -> tuple[str, TokenInfo]:
    """Create a token; the secret is returned once and never stored."""
    token = prepare_token(name, scopes, expires_at)
    return token.secret, store_token(db, token)


def delete_token(db: Database, token_id: str) -> None:
    """Undo :func:`store_token` for a token whose secret could not be kept (never handed out)."""
    with db.write() as s:
        s.execute(delete(ApiToken).where(ApiToken.token_id == token_id))


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
            raise NotFound(f"no token {token_id!r}", code="token_not_found")
        if row.revoked_at is None:
            s.execute(
                update(ApiToken).where(ApiToken.token_id == token_id).values(revoked_at=utcnow())
            )
            row = s.get(ApiToken, token_id, populate_existing=True)
            assert row is not None
        return _info(row)


def authenticate(db: Database, secret: str) -> Principal:
    """The principal a secret names; unknown and revoked tokens are ``invalid_token``, an
    expired one ``token_expired`` (both 401)."""
    with db.read() as s:
        row = s.execute(
            select(ApiToken).where(ApiToken.token_hash == hash_token(secret))
        ).scalar_one_or_none()
    if row is None or row.revoked_at is not None:
        raise AuthenticationError("the bearer token is not valid", code="invalid_token")
    info = _info(row)
    if info.expired(utcnow()):
        assert info.expires_at is not None
        raise AuthenticationError(
            f"the bearer token expired at {rfc3339(info.expires_at)}",
            code="token_expired",
            details={"token_id": info.token_id},
        )
    return Principal(info.token_id, info.name, info.scopes, info.expires_at)


def _info(row: ApiToken) -> TokenInfo:
    return TokenInfo(
        row.token_id,
        row.name,
        tuple(row.scopes.split(",")),
        as_utc(row.created_at),
        as_utc(row.revoked_at) if row.revoked_at else None,
        as_utc(row.expires_at) if row.expires_at else None,
    )


def principal_by_id(db: Database, token_id: str) -> Principal:
    """The principal of a token named by its display ID (a console session names its token
    this way); unknown, revoked and expired tokens are refused as :func:`authenticate` does."""
    with db.read() as s:
        row = s.get(ApiToken, token_id)
    if row is None or row.revoked_at is not None:
        raise AuthenticationError("the session's token is no longer valid", code="invalid_token")
    info = _info(row)
    if info.expired(utcnow()):
        raise AuthenticationError("the session's token has expired", code="token_expired")
    return Principal(info.token_id, info.name, info.scopes, info.expires_at)
