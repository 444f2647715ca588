"""Times as the ledger writes them: RFC 3339 in UTC with ``Z`` and microseconds, one format
for every signed document and answer (``2026-12-02T09:00:00.000000Z``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_TIME = r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,9}))?"
_RFC3339 = re.compile(_TIME + r"([Zz]|[+-][0-9]{2}:[0-9]{2})")
LOCAL_TIME = re.compile(_TIME)  # an RFC 3339 date-time without its zone


def rfc3339(at: datetime) -> str:
    """``at`` (aware) as RFC 3339 UTC text with ``Z`` and microseconds."""
    return at.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def utc_now() -> str:
    """Now, as :func:`rfc3339` writes it."""
    return rfc3339(datetime.now(UTC))


def parse_rfc3339(text: object, *, round_up: bool = False) -> datetime:
    """An RFC 3339 date-time with its zone (``2026-12-02T09:00:00.5Z``, ``...+01:00``; a space
    for ``T`` as RFC 3339 allows) as an aware UTC time; ValueError for any other text (a week
    date, no zone), a date that does not exist, or an instant outside the years 1-9999 in UTC.
    Digits past the microsecond are dropped, or with ``round_up`` round up to the next one."""
    found = _RFC3339.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"{str(text)[:64]!r} is not an RFC 3339 time with a zone (Z for UTC)")
    date, clock, fraction, zone = found.groups()
    micros = (fraction or "")[:6].ljust(6, "0")
    # datetime reads +00:99 as 1 h 39 min; RFC 3339 has no minute 99
    if len(zone) == 6 and zone[-2:] > "59":
        raise ValueError(f"{text!r} is not a valid time (its offset's minutes are over 59)")
    zone = "+00:00" if zone in ("Z", "z") else zone
    finer = round_up and (fraction or "")[6:].strip("0") != ""
    try:
        at = datetime.fromisoformat(f"{date}T{clock}.{micros}{zone}").astimezone(UTC)
        return at + timedelta(microseconds=1) if finer else at
    except ValueError:  # month 13, hour 25, offset +25:00
        raise ValueError(f"{text!r} is not a valid time") from None
    except OverflowError:  # 0001-01-01T00:00:00+00:01 is before year 1 in UTC
        raise ValueError(f"{text!r} is outside the years 1-9999 once in UTC") from None
