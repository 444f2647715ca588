"""Edits of ledger tables as a database superuser makes them, on Postgres and on SQLite.

Postgres: ``session_replication_role = replica`` (foreign keys off) and the tables' own
triggers disabled for the edit, re-enabled ALWAYS afterwards. SQLite: foreign keys off and
the append-only triggers dropped for the edit, re-created afterwards. Statements are written
with ``%s`` placeholders for both. Rows are addressed by the backend's row ID (``ctid`` /
``rowid``), so any column can be edited, keys included.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

Statement = tuple[str, Sequence[Any]]


class Superuser:
    def __init__(self, url: str) -> None:
        self.url = url
        self.postgres = url.startswith("postgresql")
        self.path = url.removeprefix("sqlite:///")

    def _sqlite(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA foreign_keys=OFF")
        return conn

    def execute(self, statements: Iterable[Statement], tables: Iterable[str]) -> None:
        tables = list(tables)
        if self.postgres:
            with psycopg.connect(self.url) as conn:
                conn.execute("SET session_replication_role = replica")
                for t in tables:
                    conn.execute(f"ALTER TABLE {t} DISABLE TRIGGER USER")
                for stmt, params in statements:
                    conn.execute(stmt, params)  # type: ignore[arg-type]
                for t in tables:
                    conn.execute(f"ALTER TABLE {t} ENABLE ALWAYS TRIGGER {t}_append_only")
                    conn.execute(f"ALTER TABLE {t} ENABLE ALWAYS TRIGGER {t}_no_truncate")
                conn.commit()
            return
        conn = self._sqlite()
        try:
            conn.execute("BEGIN IMMEDIATE")
            marks = ",".join("?" * len(tables))
            triggers = conn.execute(
                f"SELECT name, sql FROM sqlite_master WHERE type = 'trigger' "
                f"AND tbl_name IN ({marks})",
                tables,
            ).fetchall()
            for name, _ in triggers:
                conn.execute(f"DROP TRIGGER {name}")
            for stmt, params in statements:
                conn.execute(stmt.replace("%s", "?"), tuple(params))
            for _, sql in triggers:
                conn.execute(sql)
            conn.execute("COMMIT")
        finally:
            conn.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.postgres:
            with psycopg.connect(self.url) as conn:
                return [tuple(r) for r in conn.execute(sql, params).fetchall()]  # type: ignore[arg-type]
        conn = self._sqlite()
        try:
            return [tuple(r) for r in conn.execute(sql.replace("%s", "?"), tuple(params))]
        finally:
            conn.close()

    # -- rows by row ID ------------------------------------------------------------------

    @property
    def row_id(self) -> str:
        return "ctid" if self.postgres else "rowid"

    def columns(self, table: str) -> list[str]:
        if self.postgres:
            rows = self.query(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                "ORDER BY ordinal_position",
                (table,),
            )
            return [r[0] for r in rows]
        return [r[1] for r in self.query(f"PRAGMA table_info({table})")]

    def rows(self, table: str) -> list[tuple[str, dict[str, Any]]]:
        """(row ID, {column: value}) for every row of ``table``."""
        columns = self.columns(table)
        rid = "ctid::text" if self.postgres else "rowid"
        found = self.query(f"SELECT {rid}, {', '.join(columns)} FROM {table}")
        return [(str(r[0]), dict(zip(columns, r[1:], strict=True))) for r in found]

    def time(self, at: datetime) -> Any:
        """A time as this backend's ledger stores it (SQLite: SQLAlchemy's naive UTC text)."""
        if self.postgres:
            return at
        return at.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")

    def read_time(self, value: Any) -> datetime:
        if isinstance(value, datetime):
            return value
        return datetime.fromisoformat(value).replace(tzinfo=UTC)

    def set(self, table: str, row: str, column: str, value: Any) -> str:
        """Set one column of one row; returns the row's ID after the update (a Postgres
        update moves the row: its ``ctid`` changes)."""
        if self.postgres:
            with psycopg.connect(self.url) as conn:
                conn.execute("SET session_replication_role = replica")
                conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
                new = conn.execute(
                    f"UPDATE {table} SET {column} = %s WHERE ctid = %s::tid "  # type: ignore[arg-type]
                    "RETURNING ctid::text",
                    (value, row),
                ).fetchone()
                conn.execute(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_append_only")
                conn.execute(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_no_truncate")
                conn.commit()
            assert new is not None
            return str(new[0])
        self.execute(
            [(f"UPDATE {table} SET {column} = %s WHERE rowid = %s", (value, row))], [table]
        )
        return row
