"""Shared CLI plumbing: settings, database, error printing, JSON output."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

import migrations
from api.settings import Settings
from ledger.errors import LedgerError
from ledger.signing import SigningKey, load_public_key
from ledger.storage.database import Database, sqlite_file

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)
T = TypeVar("T")

DbOption = typer.Option(
    None, "--db", help="database URL (default: LEDGER_DATABASE_URL, else the embedded SQLite)"
)
JsonOption = typer.Option(False, "--json", help="print JSON for scripts")
ApiOption = typer.Option(
    "http://127.0.0.1:8700", "--api", envvar="LEDGER_API_URL", help="ledger API base URL"
)
TokenFileOption = typer.Option(
    None,
    "--token-file",
    envvar="LEDGER_TOKEN_FILE",
    help="file holding a bearer token (default: the admin token file)",
)


def load_settings(**overrides: Any) -> Settings:
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first.get("loc") or ()
        name = f"LEDGER_{str(loc[0]).upper()}: " if loc else ""  # the variable, when one is named
        fail(f"invalid settings: {name}{first.get('msg')}")


def open_database(url: str | None, *, migrate: bool = False) -> tuple[Settings, Database]:
    """Open the configured database; with ``migrate`` bring its schema up to date first."""
    settings = load_settings(database_url=url)
    db = Database(settings.resolved_database_url)
    if migrate:
        migrations.upgrade(db)
    return settings, db


def open_existing_database(url: str | None) -> tuple[Settings, Database]:
    """Open a ledger database that must already exist, for commands that only read it: a
    mistyped path or URL is an error (exit 2), never a new, empty ledger."""
    settings = load_settings(database_url=url)
    resolved = settings.resolved_database_url
    path = sqlite_file(resolved)
    hint = "create one with `ledger db upgrade` (or `ledger serve`)"
    if path is not None and not path.is_file():
        fail(f"no ledger database at {path}: {hint}, or name the right one with --db", 2)
    db = Database(resolved)
    if migrations.current_revision(db) is None:
        fail(f"no ledger schema in {db.describe()}: {hint}", 2)
    return settings, db


def token_file_or_default(path: Path | None) -> Path:
    return path or load_settings().resolved_admin_token_file


def fail(message: str, code: int = 1) -> Any:
    # Messages carry codes in brackets ("[engine_unreachable]"): print them, not as markup.
    err_console.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


@contextmanager
def ledger_errors(code: int = 1) -> Iterator[None]:
    """Print a LedgerError as a one-line message and exit with ``code``."""
    try:
        yield
    except LedgerError as exc:
        fail(f"{exc.message} [{exc.code}]", code)


def run(fn: Callable[[], T]) -> T:
    with ledger_errors():
        return fn()
    raise AssertionError("unreachable")


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def read_public_key(path: Path) -> Ed25519PublicKey:
    """A public key from a PEM file (a private key file yields its public half)."""
    try:
        data = path.read_bytes()
        if b"PRIVATE" in data:
            return SigningKey.from_pem(data).public_key
        return load_public_key(data)
    except OSError as exc:
        fail(f"cannot read key {path}: {exc.strerror}")
    except LedgerError as exc:
        fail(f"cannot read key {path}: {exc.message}")
    raise AssertionError("unreachable")
