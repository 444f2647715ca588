"""``ledger db``: schema migrations."""

from __future__ import annotations

import typer

import migrations
from cli.common import DbOption, console, ledger_errors, open_database

app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)


@app.command("upgrade")
def upgrade(db_url: str | None = DbOption, revision: str = "head") -> None:
    """Apply migrations up to REVISION (default: the latest)."""
    with ledger_errors():
        _, db = open_database(db_url)
        migrations.upgrade(db, revision)
        console.print(f"{db.describe()}: at revision {migrations.current_revision(db)}")


@app.command("current")
def current(db_url: str | None = DbOption) -> None:
    """Show the database's revision and the latest one."""
    with ledger_errors():
        _, db = open_database(db_url)
        console.print(
            f"{db.describe()}: at {migrations.current_revision(db)}, "
            f"latest {migrations.head_revision(db)}"
        )
