"""A cache key's index rows, read on the path of every lookup.

:func:`read_rows` reads a key's first rows in log order (``ROWS_LIMIT``: the 16 envelopes
:func:`ledger.storage.cache.find_reusable` reads at once, and one more) in one statement
outside a transaction, prepared on Postgres; :class:`AsyncRows` does the same on the event
loop, and on Postgres also reads the rows together with what verifying them needs (each row's
log entry, the disclosures stored for its leaf, whether ``erasures`` holds its record) in one
statement, one snapshot. :func:`found_among` verifies those as ``find_reusable`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from sqlalchemy.engine import make_url

from ledger.errors import LedgerError
from ledger.storage.cache import (
    CHUNK,
    Found,
    checked_candidate,
    is_marked,
    logged_candidate,
    unusable,
)
from ledger.storage.database import Database, translated_errors
from ledger.storage.queries import content_applied

Rows = tuple[tuple[int, str, int, bool], ...]  # (log_index, request_id, tier, deterministic)
ROWS_LIMIT = CHUNK + 1
_ROWS_SQL = (
    "SELECT log_index, request_id, tier, deterministic FROM cache_keys WHERE cache_key = {p} "
    f"ORDER BY log_index, request_id LIMIT {ROWS_LIMIT}"
)
_ROWS_POSTGRES, _ROWS_SQLITE = _ROWS_SQL.format(p="%s"), _ROWS_SQL.format(p="?")
# The same rows with what verifying them needs, in one statement (one snapshot): each row's log
# entry, the disclosures stored for that leaf (in digest order, as ``disclosures_at`` reads
# them) and whether ``erasures`` holds its record.
_CANDIDATES_POSTGRES = (
    "SELECT k.log_index, k.request_id, k.tier, k.deterministic, e.idx, e.envelope, "
    "e.appended_at, ARRAY(SELECT d.disclosure FROM disclosures d WHERE d.log_index = "
    "k.log_index ORDER BY d.digest), EXISTS (SELECT 1 FROM erasures x WHERE x.request_id = "
    "k.request_id) FROM cache_keys k LEFT JOIN log_entries e ON e.idx = k.log_index "
    f"WHERE k.cache_key = %s ORDER BY k.log_index, k.request_id LIMIT {ROWS_LIMIT}"
)


class _Row(NamedTuple):
    log_index: int
    request_id: str
    tier: int
    deterministic: bool


class _Entry(NamedTuple):
    idx: int
    envelope: bytes
    appended_at: datetime


@dataclass(frozen=True)
class Candidate:
    """A key's index row as read with its log entry (None: none), stored content and erasure."""

    row: _Row
    entry: _Entry | None
    disclosures: tuple[str, ...]
    erased: bool


class NotRead(Exception):
    """Raised by a ``chat_template`` callback for a fingerprint whose facts are not at hand
    (the lookup then goes to the full check, which reads them)."""


def found_among(
    key: str,
    candidates: list[Candidate],
    chat_template: Callable[[str], str | None],
    pool: str | None = None,
) -> Found | None:
    """The key's earliest reusable record among the rows read with their entries, verified as
    :func:`ledger.storage.cache.find_reusable` verifies it (the marked rows in log order, each
    against its entry, until one is reusable as logged); None when they hold none (the route
    says why) or a row does not agree with its entry (the route raises ``index_mismatch``)."""
    reasons: set[str] = set()
    seen: list[tuple[int, str]] = []
    try:
        for c in candidates:
            if not is_marked(c.row):
                continue
            stored = logged_candidate(key, c.row, c.entry)
            stored = content_applied(stored, c.disclosures, c.erased)
            stored = checked_candidate(key, c.row, stored, chat_template)
            seen.append((c.row.log_index, c.row.request_id))
            why = unusable(stored, pool)
            if why is None:  # ``rows``: those read (the key may have more after them)
                return Found(stored, tuple(seen), len(candidates), frozenset(reasons))
            reasons.add(why)
    except (LedgerError, NotRead):
        return None
    return None


def _as_rows(raw: Any) -> Rows:
    """Driver rows as :data:`Rows` (SQLite's booleans are 0 and 1)."""
    return tuple((int(i), str(r), int(t), bool(d)) for i, r, t, d in raw)


def read_rows(db: Database, key: str) -> Rows:
    """The key's first index rows, in log order: one statement, outside a transaction (a
    single statement reads one consistent snapshot), prepared on Postgres."""
    with translated_errors():
        pooled = db.engine.raw_connection()
        try:
            conn: Any = pooled.driver_connection
            if db.is_postgres:
                conn.autocommit = True  # no BEGIN and COMMIT round trips; put back below
                try:
                    cursor = conn.execute(_ROWS_POSTGRES, (key,), prepare=True)
                    rows = cursor.fetchall()
                finally:
                    conn.autocommit = False
            else:  # SQLite's connections are in autocommit mode outside BEGIN
                rows = conn.execute(_ROWS_SQLITE, (key,)).fetchall()
        finally:
            pooled.close()
    return _as_rows(rows)


_Reader = tuple[psycopg.AsyncConnection[Any], psycopg.AsyncCursor[Any]]


class AsyncRows:
    """:func:`read_rows` for the event loop: on Postgres through a few autocommit connections of
    its own (psycopg's async driver, statements prepared, one binary cursor per connection
    kept with it), on SQLite the same statement at once (a local read of microseconds). One
    per app, used on one event loop."""

    def __init__(self, db: Database, keep: int = 8) -> None:
        self.db, self._keep = db, keep
        self._idle: list[_Reader] = []
        self._url = (
            make_url(db.url).set(drivername="postgresql").render_as_string(hide_password=False)
            if db.is_postgres
            else ""
        )

    async def rows(self, key: str) -> Rows:
        if not self.db.is_postgres:
            return read_rows(self.db, key)
        return _as_rows(await self._fetch(_ROWS_POSTGRES, key))

    async def candidates(self, key: str) -> list[Candidate] | None:
        """The key's first rows with their entries and content, in one statement (None on
        SQLite: the route reads them, locally)."""
        if not self.db.is_postgres:
            return None
        return [
            Candidate(
                _Row(int(i), str(r), int(t), bool(d)),
                None if idx is None else _Entry(int(idx), bytes(env), at),
                tuple(disclosures),
                bool(erased),
            )
            for i, r, t, d, idx, env, at, disclosures, erased in await self._fetch(
                _CANDIDATES_POSTGRES, key
            )
        ]

    async def _fetch(self, statement: str, key: str) -> list[tuple[Any, ...]]:
        with translated_errors():
            reader = self._idle.pop() if self._idle else await self._connect()
            try:
                await reader[1].execute(statement, (key,), prepare=True)
                rows = await reader[1].fetchall()
            except BaseException:
                await reader[0].close()
                raise
        if len(self._idle) < self._keep:
            self._idle.append(reader)
        else:
            await reader[0].close()
        return rows

    async def _connect(self) -> _Reader:
        conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
        return conn, conn.cursor(binary=True)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        await asyncio.gather(*(conn.close() for conn, _ in idle), return_exceptions=True)
