"""API bearer tokens: generation, hashing, scopes and expiry. Only a token's hash is stored."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ledger.clock import rfc3339
from ledger.errors import InvalidInput

SCOPES = ("records:write", "records:read", "cache:read", "replay", "erasure", "holds", "admin")
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


_DURATION = re.compile(r"([1-9][0-9]{0,9})([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_RFC3339 = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,9}))?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
EXPIRY_FORMS = "a duration (30d, 12h, 90m, 3600s, 2w) or an RFC 3339 time with zone"


def parse_expiry(text: str, now: datetime) -> datetime:
    """When a token given ``--expires TEXT`` at ``now`` stops working (aware UTC).

    TEXT is a positive whole number of seconds, minutes, hours, days or weeks (``30d``), or an
    RFC 3339 date-time with a zone (``2027-01-31T00:00:00Z``). It must lie in the future.
    """
    value = text.strip()
    try:
        if m := _DURATION.fullmatch(value):
            expires = now.astimezone(UTC) + timedelta(seconds=int(m[1]) * _UNITS[m[2]])
        elif m := _RFC3339.fullmatch(value):
            date, clock, fraction, zone = m.groups()
            micros = (fraction or "")[:6].ljust(6, "0")  # finer digits are dropped
            if len(zone) == 6 and zone[-2:] > "59":  # datetime would read +00:99 as 1 h 39 min
                raise ValueError("its offset's minutes are over 59")
            zone = "+00:00" if zone in ("Z", "z") else zone
            expires = datetime.fromisoformat(f"{date}T{clock}.{micros}{zone}").astimezone(UTC)
        else:
            raise ValueError("not a duration or an RFC 3339 time")
    except OverflowError as exc:  # well formed, but outside the times a datetime holds
        where = (
            "before 0001-01-01T00:00:00Z, long past"
            if _RFC3339.fullmatch(value) and value[:4] == "0001"
            else "after 9999-12-31T23:59:59Z, the latest time the ledger can store"
        )
        raise InvalidInput(
            f"invalid expiry {text!r}: it lies {where}", code="invalid_expiry"
        ) from exc
    except ValueError as exc:  # not either form, or a date that does not exist (02-30)
        why = str(exc) if _RFC3339.fullmatch(value) else f"expected {EXPIRY_FORMS}"
        raise InvalidInput(f"invalid expiry {text!r}: {why}", code="invalid_expiry") from exc
    check_expiry(expires, now)
    return expires


def check_expiry(expires: datetime, now: datetime) -> None:
    if expires.tzinfo is None:
        raise InvalidInput("a token's expiry needs a time zone", code="invalid_expiry")
    if expires <= now:
        raise InvalidInput(
            f"the expiry {rfc3339(expires)} is not in the future", code="invalid_expiry"
        )


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's display ID, name, scopes and expiry (None: never)."""

    token_id: str
    name: str
    scopes: tuple[str, ...]
    expires_at: datetime | None = None

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at
