"""Alembic migrations. ``upgrade(url)`` brings a database to the latest schema.

The same revisions run on SQLite and Postgres; Postgres-only objects (append-only triggers
enabled ALWAYS) are created by dialect-aware steps.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from ledger.errors import InvalidInput
from ledger.storage.database import Database, translated_errors

HERE = Path(__file__).resolve().parent


def alembic_config(db: Database) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    cfg.set_main_option("sqlalchemy.url", db.url.replace("%", "%%"))
    cfg.attributes["database"] = db
    return cfg


def revisions() -> list[str]:
    """Every revision ID, oldest first."""
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    return [
        script.revision
        for script in reversed(list(ScriptDirectory.from_config(cfg).walk_revisions()))
    ]


def check_revision(revision: str) -> None:
    """``head`` or a revision ID this version knows; InvalidInput ``unknown_revision``
    otherwise (before any database is opened)."""
    known = revisions()
    if revision != "head" and revision not in known:
        raise InvalidInput(
            f"unknown revision {revision!r}: pass head or one of {', '.join(known)}",
            code="unknown_revision",
        )


def upgrade(db: Database, revision: str = "head") -> None:
    """Bring the schema to ``revision``. Refuses (InvalidInput) a database at a revision this
    version does not know (``schema_too_new``), a revision older than the database's
    (``no_downgrade``), and a database that holds other tables but no ledger schema
    (``not_a_ledger_database``): the schema is never installed beside another application's."""
    check_revision(revision)
    known = revisions()
    at = current_revision(db)
    if at is None:
        check_no_other_tables(db)
    else:
        check_known(db, at)
        target = known[-1] if revision == "head" else revision
        if known.index(target) < known.index(at):
            raise InvalidInput(
                f"{db.describe()} is at revision {at}, after {target}: the ledger does not "
                "downgrade a schema (restore a backup taken at that revision instead)",
                code="no_downgrade",
            )
    with translated_errors():
        command.upgrade(alembic_config(db), revision)


def check_no_other_tables(db: Database) -> None:
    """For a database without a ledger schema: it holds no other application's tables either;
    InvalidInput ``not_a_ledger_database`` otherwise."""
    others = _tables(db) - {"alembic_version"}
    if others:
        raise InvalidInput(
            f"{db.describe()} holds tables ({', '.join(sorted(others)[:5])}) but no ledger "
            "schema: name an empty database for a new ledger",
            code="not_a_ledger_database",
        )


def check_known(db: Database, at: str) -> None:
    known = revisions()
    if at not in known:
        raise InvalidInput(
            f"{db.describe()} is at revision {at}, which this ledger does not know (it knows "
            f"up to {known[-1]}): it was written by a newer version; run that version",
            code="schema_too_new",
        )


def check_current(db: Database) -> None:
    """For commands that read a ledger without migrating it: its schema is this version's.
    InvalidInput ``schema_outdated`` (upgrade it first) or ``schema_too_new`` otherwise."""
    at = current_revision(db)
    if at is None:
        return
    check_known(db, at)
    head = revisions()[-1]
    if at != head:
        raise InvalidInput(
            f"{db.describe()} is at revision {at}; this ledger reads revision {head}: run "
            "`ledger db upgrade` on it (on a copy, for a backup)",
            code="schema_outdated",
        )


def _tables(db: Database) -> set[str]:
    with translated_errors(), db.engine.connect() as conn:
        return set(inspect(conn).get_table_names())


def current_revision(db: Database) -> str | None:
    with translated_errors(), db.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision(db: Database) -> str | None:
    return ScriptDirectory.from_config(alembic_config(db)).get_current_head()
