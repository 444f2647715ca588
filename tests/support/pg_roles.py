"""The Postgres roles a deployment gives the ledger (docs/OPERATIONS.md), under names of this
test run's own, so that nothing of a real deployment on the same server is touched."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

from tests.support.databases import require_postgres

ROLES = ("ledger_owner", "ledger_app", "ledger_auditor")


@contextmanager
def run_names() -> Iterator[dict[str, str]]:
    """Each role with a suffix, the database ``ledger_roles_<suffix>``; dropped afterwards,
    whatever the test did."""
    admin = require_postgres()
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed (`make tools` installs it where it can)")
    suffix = uuid.uuid4().hex[:8]
    names = {role: f"{role}_{suffix}" for role in ROLES} | {"database": f"ledger_roles_{suffix}"}
    try:
        yield names
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(names["database"])
                )
            )
            for role in ROLES:
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(names[role])))


def renamed(text: str, names: dict[str, str]) -> str:
    """``text`` (SQL or shell) with the roles and the database ``ledger`` renamed."""
    text = text.replace(
        "CREATE DATABASE ledger OWNER", f"CREATE DATABASE {names['database']} OWNER"
    )
    text = text.replace("\\c ledger\n", f"\\c {names['database']}\n")
    for role in ROLES:  # no role's name holds another's
        text = text.replace(role, names[role])
    return text


def url_as(role: str, names: dict[str, str]) -> str:
    admin = urlsplit(require_postgres())
    return f"postgresql://{names[role]}@{admin.hostname}:{admin.port or 5432}/{names['database']}"


def assert_app_cannot_unprotect(names: dict[str, str]) -> None:
    """What the roles are for: the serving role reads and writes the tables the owner's
    migrations made, and cannot disable the log's triggers."""
    with psycopg.connect(url_as("ledger_app", names), autocommit=True) as app:
        app.execute("SELECT count(*) FROM log_entries").fetchone()
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must be owner"):
            app.execute("ALTER TABLE log_entries DISABLE TRIGGER ALL")
