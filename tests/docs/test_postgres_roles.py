"""OPERATIONS.md's Postgres roles, run as written, and what the page says they prevent.

The ``<!-- docs-test: postgres -->`` block runs as a Postgres superuser (the suite's admin
URL), with its names made this run's own so that nothing of a real deployment on the same
server is touched: ``ledger_owner``, ``ledger_app`` and ``ledger_auditor`` get a suffix, the
database ``ledger`` becomes ``ledger_roles_<suffix>``, ``db-host`` the server's host and port,
and port 8700 a free one. It must exit 0 without a traceback: migrations as the owner, the
server as the app role, a full audit as the auditor. Then the page's claims are checked: the
app role cannot disable the log's triggers, nor delete from the log, and the auditor cannot
write. Roles and database are dropped at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from tests.support.databases import require_postgres
from tests.support.docblocks import ROOT, BlockShells, reader_env, shell_blocks
from tests.support.engine import free_port
from tests.support.pg_roles import assert_app_cannot_unprotect, renamed, run_names, url_as

pytestmark = pytest.mark.postgres
OPERATIONS = ROOT / "docs" / "OPERATIONS.md"


def _roles_block() -> tuple[int, str]:
    blocks = [b for b in shell_blocks(OPERATIONS) if b.needs == "postgres"]
    assert len(blocks) == 1, [b.where for b in blocks]
    return blocks[0].line, blocks[0].code


@pytest.fixture
def names() -> Iterator[dict[str, str]]:
    with run_names() as names:
        yield names


def test_the_postgres_roles_of_operations_md_work_as_it_says(tmp_path: Path, names: dict[str, str]):
    admin_url = require_postgres()
    admin = urlsplit(admin_url)
    line, code = _roles_block()
    port = str(free_port())
    code = renamed(
        code.replace("psql -h db-host -U postgres", f"psql -v ON_ERROR_STOP=1 '{admin_url}'")
        .replace("@db-host/ledger", f"@{admin.hostname}:{admin.port or 5432}/{names['database']}")
        .replace("127.0.0.1:8700", f"127.0.0.1:{port}"),
        names,
    )
    env = reader_env(tmp_path) | {"LEDGER_PORT": port}
    shells = BlockShells(tmp_path, env)
    try:
        output = shells.run(f"docs/OPERATIONS.md:{line}", code, tmp_path / "block.log")
    finally:
        shells.stop()  # the server the block started
    assert "every check passed" in output, output  # the audit, as the auditor

    # What the page says these grants prevent.
    assert_app_cannot_unprotect(names)
    with psycopg.connect(url_as("ledger_app", names), autocommit=True) as app:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="is append-only"):
            app.execute("DELETE FROM log_entries")
        assert app.execute("SELECT count(*) FROM log_entries").fetchone()[0] >= 1
    with psycopg.connect(url_as("ledger_auditor", names), autocommit=True) as auditor:
        assert auditor.execute("SELECT count(*) FROM log_entries").fetchone()[0] >= 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            auditor.execute("DELETE FROM api_tokens")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must be owner"):
            auditor.execute("ALTER TABLE log_entries DISABLE TRIGGER ALL")
