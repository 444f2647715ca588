"""Alembic environment: runs online against the Database passed in by ``migrations.upgrade``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from ledger.storage.database import Database
from ledger.storage.models import Base

config = context.config
target_metadata = Base.metadata
MIGRATION_LOCK_KEY = 0x1ED6E13


def run_migrations_online() -> None:
    db = config.attributes.get("database")
    if db is None:
        db = Database(config.get_main_option("sqlalchemy.url") or "")
    with db.engine.connect() as connection:
        if db.is_postgres:
            # Several API processes may start at once: one migrates, the others wait.
            connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            connection.commit()
        try:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=db.dialect == "sqlite",
            )
            with context.begin_transaction():
                context.run_migrations()
        finally:
            if db.is_postgres:
                connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
                connection.commit()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run them online")
run_migrations_online()
