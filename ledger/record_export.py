"""Search results as rows for export: one column list for the console's CSV and for
``ledger records search --csv``, so a file from either has the same columns, in this order;
each column is the API search item's member of that name."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from typing import Any

COLUMNS = (
    "request_id",
    "log_index",
    "received_at",
    "model",
    "pool",
    "worker_id",
    "tier",
    "endpoint",
    "fingerprint_id",
    "aborted",
    "content",
    "verdict",
    "held_by",
    "content_hash",
    "key_id",
    "schema_version",
)


# A spreadsheet reads a cell that starts with one of these as a formula (OWASP, "CSV
# injection"): text from a record (its model name, its pool) is written after a quote.
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value.startswith(_FORMULA):
        return "'" + value
    return value


def csv_line(meta: Mapping[str, Any]) -> str:
    """One CSV line (RFC 4180, CRLF) of a search item's COLUMNS."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerow([_cell(meta.get(c)) for c in COLUMNS])
    return out.getvalue()


def csv_header() -> str:
    return csv_line({c: c for c in COLUMNS})
