"""Fresh, migrated databases for tests: SQLite files and Postgres databases from a template."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import migrations
from ledger.storage.database import Database

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"


def postgres_admin_url() -> str:
    return os.environ.get("LEDGER_TEST_POSTGRES_URL", DEFAULT_PG)


def require_postgres() -> str:
    """The admin URL; skip when unreachable, but fail under CI=true (never silently skip)."""
    url = postgres_admin_url()
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as exc:
        message = f"PostgreSQL is unreachable at {url}: {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (CI=true: Postgres tests must run)")
        pytest.skip(message)
    return url


def _with_db(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


class PostgresDatabases:
    """Creates databases named ledger_test_<run>_<n>; drops them all at the end."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.run = uuid.uuid4().hex[:8]
        self.created: list[str] = []
        self._template: str | None = None

    def _exec(self, statement: sql.Composable) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(statement)

    def create(self, template: str | None = None) -> str:
        name = f"ledger_test_{self.run}_{len(self.created)}"
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            stmt = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        self._exec(stmt)
        self.created.append(name)
        return _with_db(self.admin_url, name)

    def fresh(self) -> str:
        """A new database with the latest schema (cloned from a migrated template)."""
        if self._template is None:
            url = self.create()
            db = Database(url)
            migrations.upgrade(db)
            db.dispose()
            self._template = self.created[-1]
        return self.create(self._template)

    def drop_all(self) -> None:
        for name in reversed(self.created):
            self._exec(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


class SqliteDatabases:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.template = root / "template.db"
        self.count = 0

    def fresh(self) -> str:
        if not self.template.exists():
            db = Database(f"sqlite:///{self.template}")
            migrations.upgrade(db)
            db.dispose()
        self.count += 1
        path = self.root / f"db{self.count}.db"
        shutil.copyfile(self.template, path)
        return f"sqlite:///{path}"
