"""Whether the database still enforces what the ledger's migrations installed.

The append-only triggers do not make the log trustworthy (``ledger audit`` does), but a
database superuser can also change what the application *reads* without changing a row:
row-level security with a policy hides a logged record from the ledger's role only, a rule
rewrites a query, a trigger function replaced by one that lets an UPDATE through turns the
guard off without ``DISABLE TRIGGER``. None of these edits a row, so no check of the rows
sees them; :func:`problems` reads the catalog for each, and the audit reports what it finds.

Expected, per ledger table: on Postgres a ``{table}_append_only`` row trigger (calling
``ledger_delete_only_erased()`` for the two tables erasure deletes from, else
``ledger_refuse_mutation()``) and a ``{table}_no_truncate`` statement trigger, both enabled
ALWAYS, the two functions as the migrations wrote them, no row-level security, no policy
and no rule; on SQLite the ``{table}_no_update`` trigger and a ``{table}_no_delete`` (or
``{table}_erasure_only``) trigger.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import Connection, text

from ledger.storage.models import APPEND_ONLY_TABLES, ERASABLE_TABLES

TABLES = APPEND_ONLY_TABLES + ERASABLE_TABLES

REFUSE = "ledger_refuse_mutation"
ERASED_ONLY = "ledger_delete_only_erased"
# SHA-256 of each function's source (prosrc, blank lines and spaces trimmed at both ends), as
# revisions 0002 and 0009 create them.
FUNCTION_SOURCES = {
    REFUSE: "788dab18e60ae5ad1aa5c5208c4140f8f9afe206ea84ee66ea69a8e84e53a549",
    ERASED_ONLY: "fd72dad17b049762ee22e42637c01f46d6bfa527affddd7b817cc2fc3f909f37",
}


def problems(conn: Connection) -> list[tuple[str | None, str]]:
    """(table or None, what is wrong) for every protection the database does not hold."""
    if conn.dialect.name == "postgresql":
        return _postgres(conn)
    if conn.dialect.name == "sqlite":
        return _sqlite(conn)
    return []


# pg_trigger.tgtype bits: ROW 1, BEFORE 2, DELETE 8, UPDATE 16, TRUNCATE 32
_ROW_GUARD = 1 | 2 | 8 | 16  # BEFORE UPDATE OR DELETE, FOR EACH ROW
_TRUNCATE_GUARD = 2 | 32  # BEFORE TRUNCATE, FOR EACH STATEMENT


def _postgres(conn: Connection) -> list[tuple[str | None, str]]:
    found: list[tuple[str | None, str]] = []
    # By name (pg_namespace), not current_schema()::regnamespace, which folds "Ledger" to ledger.
    in_schema = "n.nspname = current_schema() AND c.relname = ANY(:tables)"
    tables = {"tables": list(TABLES)}
    triggers = {
        (row.relname, row.tgname): row
        for row in conn.execute(
            text(
                "SELECT c.relname, t.tgname, t.tgenabled, t.tgtype, t.tgqual IS NOT NULL AS "
                "conditional, p.prosrc FROM pg_trigger t "
                "JOIN pg_class c ON c.oid = t.tgrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "JOIN pg_proc p ON p.oid = t.tgfoid "
                f"WHERE NOT t.tgisinternal AND {in_schema}"
            ),
            tables,
        )
    }
    for table in TABLES:
        guard = ERASED_ONLY if table in ERASABLE_TABLES else REFUSE
        for name, function, kind in (
            (f"{table}_append_only", guard, _ROW_GUARD),
            (f"{table}_no_truncate", REFUSE, _TRUNCATE_GUARD),
        ):
            found += [
                (table, f"trigger {name} {p}")
                for p in _trigger(triggers.get((table, name)), function, kind)
            ]
    for row in conn.execute(
        text(
            "SELECT c.relname, c.relrowsecurity, "
            "(SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid) AS policies, "
            "(SELECT count(*) FROM pg_rewrite r WHERE r.ev_class = c.oid) AS rules "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE {in_schema} ORDER BY c.relname"
        ),
        tables,
    ):
        if row.relrowsecurity or row.policies:
            found.append(
                (
                    row.relname,
                    f"row-level security is on or {row.policies} policies are set on "
                    f"{row.relname}: the rows a role reads may not be the table's",
                )
            )
        if row.rules:
            found.append((row.relname, f"{row.rules} rules rewrite queries on {row.relname}"))
    return found


def _trigger(row: Any, function: str, kind: int) -> list[str]:
    """What is wrong with one guard trigger (its row of the catalog, None when absent)."""
    if row is None:
        return ["is missing: the table can be edited"]
    problems = []
    if row.tgenabled != "A":
        problems.append(f"is not enabled ALWAYS (state {row.tgenabled!r})")
    if row.tgtype != kind or row.conditional:
        problems.append("fires on other events or only under a condition")
    if _source_digest(row.prosrc) != FUNCTION_SOURCES[function]:
        problems.append(f"calls a function that is not the ledger's {function}()")
    return problems


def _source_digest(source: str | None) -> str | None:
    return hashlib.sha256(source.strip(" \n").encode()).hexdigest() if source else None


def sqlite_guard(table: str, verb: str) -> str:
    """The SQLite trigger refusing ``verb`` (UPDATE or DELETE) on ``table``, as migrations
    create it and the audit expects it."""
    return (
        f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
        f"BEGIN SELECT RAISE(ABORT, 'ledger table {table} is append-only: {verb} refused'); END"
    )


def sqlite_erasure_guard(table: str) -> str:
    """The SQLite trigger letting only a logged erasure delete from ``table``."""
    return (
        f"CREATE TRIGGER {table}_erasure_only BEFORE DELETE ON {table} "
        "WHEN NOT EXISTS (SELECT 1 FROM erasures WHERE request_id = OLD.request_id) "
        f"BEGIN SELECT RAISE(ABORT, 'ledger table {table} refused DELETE: only a logged "
        "erasure deletes content'); END"
    )


def _sqlite(conn: Connection) -> list[tuple[str | None, str]]:
    stored = {
        row.name: (row.tbl_name, row.sql)
        for row in conn.execute(
            text("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger'")
        )
    }
    found: list[tuple[str | None, str]] = []
    for table in TABLES:
        erasable = table in ERASABLE_TABLES
        delete = sqlite_erasure_guard(table) if erasable else sqlite_guard(table, "DELETE")
        for sql in (sqlite_guard(table, "UPDATE"), delete):
            name = sql.split()[2]
            got = stored.get(name)
            if got is None:
                found.append((table, f"trigger {name} is missing: the table can be edited"))
            elif got != (table, sql):
                found.append((table, f"trigger {name} is not the ledger's: it was replaced"))
    return found
