"""Erasure events and legal holds: the log leaves that say who removed what content, and why.

Both are signed by the log key. Bodies (schema version 1):

    erasure       {"schema_version", "request_id",
                   "record": {"log_index", "content_hash"},
                   "erased_digests": ["sha256:…", …],   # sorted: every digest whose content
                                                        # the ledger deleted
                   "reason_code": "request" | "retention", "reason": "…",
                   "requested_by": "<token name>" | "retention", "erased_at": "…Z"}
    legal_hold    {"schema_version", "hold_id", "request_id" | null, "filter" | null,
                   "reason", "placed_by", "placed_at"}
    hold_release  {"schema_version", "hold_id", "reason", "released_by", "released_at"}

A hold names one request ID or a search filter (``model``, ``fingerprint_id``, ``pool``,
``tier``, ``since``, ``until``; the record's receive time for the last two). While a hold is
placed and not released, no erasure (by request or by retention) may touch a record it covers.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ledger.clock import utc_now
from ledger.errors import InvalidInput
from ledger.records import check_request_id

ERASURE_KIND = "erasure"
HOLD_KIND = "legal_hold"
RELEASE_KIND = "hold_release"
SCHEMA_VERSION = 1
ERASURE_REASONS = ("request", "retention")
MAX_REASON = 1000
FILTER_MEMBERS = ("model", "fingerprint_id", "pool", "tier", "since", "until")
_HOLD_ID = re.compile(r"^hold-[0-9a-f]{24}$")


def check_reason(reason: object) -> str:
    """A reason as it is signed into the log: text a person reads later, on a terminal or a
    page, so without control or format characters but tab, line feed and carriage return (an
    escape sequence would rewrite what a reader's terminal shows, a bidirectional override
    the order a page shows it in)."""
    if (
        not isinstance(reason, str)
        or not reason.strip()
        or len(reason) > MAX_REASON
        or any(_hidden(c) for c in reason)
    ):
        raise InvalidInput(
            f"a reason is 1-{MAX_REASON} characters of text, without control or format "
            "characters (but tab and line breaks)",
            code="invalid_parameters",
        )
    return reason


def _hidden(char: str) -> bool:
    return char not in "\t\n\r" and unicodedata.category(char) in ("Cc", "Cf", "Cs")


def erasure_body(
    *,
    request_id: str,
    log_index: int,
    content_hash: str,
    erased_digests: Sequence[str],
    reason_code: str,
    reason: str,
    requested_by: str,
    erased_at: str,
) -> dict[str, Any]:
    """An erasure event's body; ``erased_at`` (RFC 3339) is the time the log appends it at."""
    if reason_code not in ERASURE_REASONS:
        raise InvalidInput(
            f"reason_code must be one of {ERASURE_REASONS}", code="invalid_parameters"
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "request_id": request_id,
        "record": {"log_index": log_index, "content_hash": content_hash},
        "erased_digests": sorted(set(erased_digests)),
        "reason_code": reason_code,
        "reason": check_reason(reason),
        "requested_by": requested_by,
        "erased_at": erased_at,
    }


def check_hold_id(hold_id: str) -> str:
    if not _HOLD_ID.fullmatch(hold_id):
        raise InvalidInput("a hold ID is hold- and 24 hex digits", code="invalid_parameters")
    return hold_id


def hold_body(
    *,
    hold_id: str,
    request_id: str | None,
    filter: Mapping[str, Any] | None,
    reason: str,
    placed_by: str,
    placed_at: str | None = None,
) -> dict[str, Any]:
    """A hold's body; ``placed_at`` (default now) is the time its leaf is appended at."""
    # a filter member given as null names nothing: a filter of nulls alone is empty
    named = {k: v for k, v in filter.items() if v is not None} if filter is not None else None
    if (request_id is None) == (filter is None) or (named is not None and not named):
        raise InvalidInput(
            "a hold names either a request_id or a non-empty filter, not both",
            code="invalid_parameters",
        )
    if request_id is not None:
        check_request_id(request_id)
    if named and set(named) - set(FILTER_MEMBERS):
        raise InvalidInput(
            f"a hold's filter takes only {list(FILTER_MEMBERS)}", code="invalid_parameters"
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "hold_id": check_hold_id(hold_id),
        "request_id": request_id,
        "filter": named or None,
        "reason": check_reason(reason),
        "placed_by": placed_by,
        "placed_at": placed_at or utc_now(),
    }


def release_body(
    *, hold_id: str, reason: str, released_by: str, released_at: str | None = None
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "hold_id": check_hold_id(hold_id),
        "reason": check_reason(reason),
        "released_by": released_by,
        "released_at": released_at or utc_now(),
    }


@dataclass(frozen=True)
class HoldScope:
    """What a hold covers, for matching records as logged."""

    hold_id: str
    request_id: str | None
    model: str | None = None
    fingerprint_id: str | None = None
    pool: str | None = None
    tier: int | None = None
    since: datetime | None = None
    until: datetime | None = None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> HoldScope:
        flt = body.get("filter") or {}
        return cls(
            hold_id=body["hold_id"],
            request_id=body.get("request_id"),
            model=flt.get("model"),
            fingerprint_id=flt.get("fingerprint_id"),
            pool=flt.get("pool"),
            tier=flt.get("tier"),
            since=_time(flt.get("since")),
            until=_time(flt.get("until")),
        )

    def covers(
        self,
        *,
        request_id: str,
        model: str,
        fingerprint_id: str,
        pool: str,
        tier: int,
        received_at: datetime,
    ) -> bool:
        if self.request_id is not None:
            return request_id == self.request_id
        return (
            (self.model is None or model == self.model)
            and (self.fingerprint_id is None or fingerprint_id == self.fingerprint_id)
            and (self.pool is None or pool == self.pool)
            and (self.tier is None or tier == self.tier)
            and (self.since is None or received_at >= self.since)
            and (self.until is None or received_at < self.until)
        )


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
