"""Times as the ledger writes them: RFC 3339 in UTC with ``Z`` and microseconds, one format
for every signed document and answer (``2026-12-02T09:00:00.000000Z``)."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(at: datetime) -> str:
    """``at`` (aware) as RFC 3339 UTC text with ``Z`` and microseconds."""
    return at.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def utc_now() -> str:
    """Now, as :func:`rfc3339` writes it."""
    return rfc3339(datetime.now(UTC))
