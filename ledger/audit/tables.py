"""The key registry tables against the timeline, and index rows that point past the log.

``signing_keys`` and ``key_revocations`` are small and compared whole, after the scan, with
the registry the log built (``ledger.audit.registry``), column by column. Rows of any table
whose ``log_index`` is at or past the scan's end were appended while the audit ran and are
left out, unless they point past the log's end even now: no leaf will ever justify them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledger.audit.registry import KeyTimeline
from ledger.audit.report import Finding
from ledger.audit.rows import KeyRow, RevocationRow, as_time
from ledger.signing import key_id_of


def leaf_indexes(table: str, rows: Sequence[Any]) -> tuple[list[Any], list[Finding]]:
    """The rows whose ``log_index`` is an integer, and a finding for each other one (SQLite
    stores any value in an INTEGER column: a text there names no leaf)."""
    good, found = [], []
    for row in rows:
        if type(row.log_index) is int:
            good.append(row)
        else:
            found.append(
                Finding(
                    "index",
                    f"{table} row {row[0]!r} has log_index {row.log_index!r}, which names no leaf",
                    None,
                    table,
                    "log_index",
                )
            )
    return good, found


def past_the_log(table: str, rows: Sequence[Any], end: int, size: int) -> list[Finding]:
    """Rows of ``table`` at or past the scan's ``end``; those past the log's ``size`` now
    are findings."""
    return [
        Finding(
            "index",
            f"{table} row {row[0]!r} names leaf {row.log_index}, past the log's last leaf "
            f"({size - 1})",
            row.log_index,
            table,
            "log_index",
        )
        for row in rows
        if row.log_index >= max(end, size)
    ]


def _column(table: str, what: str, column: str, stored: Any, logged: Any, idx: int) -> Finding:
    shown = as_time if column.endswith("_at") else repr
    return Finding(
        "index",
        f"{table}.{column} of {what} is {shown(stored)}; the log says {shown(logged)}",
        idx,
        table,
        column,
    )


def signing_keys(timeline: KeyTimeline, rows: list[KeyRow], end: int, size: int) -> list[Finding]:
    rows, found = leaf_indexes("signing_keys", rows)
    found += past_the_log("signing_keys", rows, end, size)
    seen = set()
    for row in rows:
        if row.log_index >= end:
            continue
        seen.add(row.key_id)
        want = timeline.keys.get(row.key_id)
        if want is None:
            found.append(
                Finding(
                    "index",
                    f"signing_keys holds {row.key_id}, which the log never registered",
                    row.log_index,
                    "signing_keys",
                    "key_id",
                )
            )
            continue
        what = f"key {row.key_id}"
        raw = bytes(row.public_key)
        if key_id_of(raw) != row.key_id or raw != want.raw:
            found.append(
                Finding(
                    "index",
                    f"signing_keys row for {row.key_id} holds another public key than the log "
                    "registered",
                    row.log_index,
                    "signing_keys",
                    "public_key",
                )
            )
        for column, stored, logged in (
            ("name", row.name, want.name),
            ("role", row.role, want.role),
            ("log_index", row.log_index, want.registered_at),
            ("registered_at", row.registered_at, want.appended_at),
        ):
            if stored != logged:
                found.append(
                    _column("signing_keys", what, column, stored, logged, want.registered_at)
                )
    for key_id, entry in timeline.keys.items():
        if key_id not in seen:
            found.append(
                Finding(
                    "index",
                    f"key {key_id} is registered in the log but missing from signing_keys",
                    entry.registered_at,
                    "signing_keys",
                )
            )
    return found


def revocations(
    timeline: KeyTimeline, rows: list[RevocationRow], end: int, size: int
) -> list[Finding]:
    rows, found = leaf_indexes("key_revocations", rows)
    found += past_the_log("key_revocations", rows, end, size)
    seen = set()
    for row in rows:
        if row.log_index >= end:
            continue
        seen.add(row.key_id)
        want = timeline.revocations.get(row.key_id)
        if want is None:
            found.append(
                Finding(
                    "index",
                    f"key_revocations holds {row.key_id}, which the log never revoked",
                    row.log_index,
                    "key_revocations",
                    "key_id",
                )
            )
            continue
        what = f"the revocation of {row.key_id}"
        for column, stored, logged in (
            ("log_index", row.log_index, want.log_index),
            ("reason", row.reason, want.reason),
            ("revoked_at", row.revoked_at, want.appended_at),
        ):
            if stored != logged:
                found.append(
                    _column("key_revocations", what, column, stored, logged, want.log_index)
                )
    for key_id, revocation in timeline.revocations.items():
        if key_id not in seen:
            found.append(
                Finding(
                    "index",
                    f"key {key_id} is revoked in the log but missing from key_revocations",
                    revocation.log_index,
                    "key_revocations",
                )
            )
    return found


def tree_shape(size: int, levels: dict[Any, tuple[int, Any, Any]]) -> list[Finding]:
    """Stored Merkle nodes outside the log's complete subtrees: a log of ``size`` leaves has
    ``size >> level`` complete nodes at each level, indexes 0 onwards. The rebuild compares
    those (a missing one is named there); one beyond them is never compared, and blocks the
    append that would complete it."""
    found = []
    for level, (count, lo, hi) in sorted(levels.items(), key=_level_order):
        whole = type(level) is int and 0 <= level < 64 and type(lo) is int and type(hi) is int
        want = size >> level if whole else 0
        # more rows than indexes in the range: an index that is no integer (SQLite keeps 0.5)
        if not whole or lo < 0 or hi >= want or count > hi - lo + 1:
            found.append(
                Finding(
                    "tree",
                    f"merkle_nodes holds {count} node(s) at level {level!r} (indexes {lo!r} to "
                    f"{hi!r}); a log of {size} leaves has {want} complete node(s) there",
                    None,
                    "merkle_nodes",
                    "idx",
                )
            )
    return found


def _level_order(item: tuple[Any, Any]) -> tuple[bool, int, str]:
    level = item[0]
    return (type(level) is not int, level if type(level) is int else 0, repr(level))
