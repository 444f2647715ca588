"""The Compose deployment's Postgres roles (deploy/postgres/10-ledger-roles.sh), run as the
postgres image runs it on a new data directory, with this run's own role and database names:
migrations as the owner, the serving role unable to disable the append-only triggers."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from ledger.storage.database import Database
from migrations import upgrade
from tests.support.databases import require_postgres
from tests.support.pg_roles import assert_app_cannot_unprotect, renamed, run_names, url_as

pytestmark = pytest.mark.postgres
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "postgres" / "10-ledger-roles.sh"


@pytest.fixture
def names() -> Iterator[dict[str, str]]:
    with run_names() as names:
        yield names


def test_the_init_script_gives_the_ledger_its_roles(tmp_path: Path, names: dict[str, str]):
    admin = urlsplit(require_postgres())
    script = tmp_path / "roles.sh"
    script.write_text(renamed(SCRIPT.read_text(), names))
    env = {
        "PATH": os.environ["PATH"],
        "PGHOST": admin.hostname or "127.0.0.1",
        "PGPORT": str(admin.port or 5432),
        "POSTGRES_USER": admin.username or "postgres",
        "LEDGER_OWNER_PASSWORD": "owner-secret",
        "LEDGER_APP_PASSWORD": "app'secret",  # quoted by psql, not spliced into the SQL
    }
    done = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(require_postgres(), autocommit=True) as conn:
        passwords = dict(
            conn.execute(
                "SELECT rolname, rolpassword IS NOT NULL FROM pg_authid WHERE rolname = ANY(%s)",
                ([names[r] for r in ("ledger_owner", "ledger_app", "ledger_auditor")],),
            ).fetchall()
        )
        owner = conn.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s",
            (names["database"],),
        ).fetchone()
    assert passwords == {
        names["ledger_owner"]: True,
        names["ledger_app"]: True,
        names["ledger_auditor"]: False,
    }
    assert owner == (names["ledger_owner"],)
    upgrade(Database(url_as("ledger_owner", names)))
    assert_app_cannot_unprotect(names)
    # without the passwords the script refuses before it creates anything
    bare = {k: v for k, v in env.items() if not k.startswith("LEDGER_")}
    refused = subprocess.run(["sh", str(script)], env=bare, capture_output=True, text=True)
    assert refused.returncode != 0 and "LEDGER_OWNER_PASSWORD" in refused.stderr
