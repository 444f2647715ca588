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
    check_revision(revision)
    with translated_errors():
        command.upgrade(alembic_config(db), revision)


def current_revision(db: Database) -> str | None:
    with translated_errors(), db.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision(db: Database) -> str | None:
    return ScriptDirectory.from_config(alembic_config(db)).get_current_head()
