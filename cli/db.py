"""``ledger db``: schema migrations."""

from __future__ import annotations

import typer

import migrations
from cli.common import (
    DbOption,
    JsonOption,
    console,
    fail,
    ledger_errors,
    load_settings,
    open_database,
    print_json,
)
from ledger.storage.database import Database, sqlite_file

app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)


@app.command("upgrade")
def upgrade(
    db_url: str | None = DbOption,
    revision: str = typer.Option(
        "head", "--revision", help="the Alembic revision to reach (default: the latest)"
    ),
    as_json: bool = JsonOption,
) -> None:
    """Apply migrations up to REVISION (default: the latest)."""
    with ledger_errors():
        migrations.check_revision(revision)  # before a new database file is created
        _, db = open_database(db_url)
        migrations.upgrade(db, revision)
        _show(db, as_json)


@app.command("current")
def current(db_url: str | None = DbOption, as_json: bool = JsonOption) -> None:
    """Show the database's revision and the latest one (creates nothing; exit 2 when it
    holds no ledger)."""
    with ledger_errors():
        settings = load_settings(database_url=db_url)
        path = sqlite_file(settings.resolved_database_url)
        if path is not None and not path.is_file():
            fail(f"no ledger database at {path}: create one with `ledger db upgrade` or use --db")
        db = Database(settings.resolved_database_url)
        if migrations.current_revision(db) is None:
            migrations.check_no_other_tables(db)
            fail(f"no ledger schema in {db.describe()}: create one with `ledger db upgrade`")
        _show(db, as_json)


def _show(db: Database, as_json: bool) -> None:
    at, head = migrations.current_revision(db), migrations.head_revision(db)
    if as_json:
        print_json({"database": db.describe(), "revision": at, "head": head})
        return
    console.print(f"{db.describe()}: at revision {at}, latest {head}")
