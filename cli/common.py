"""Shared CLI plumbing: settings, database, error printing, JSON output."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

import migrations
from api.settings import Settings
from demo.errors import CheckFailed
from ledger.atomic_file import write_atomically
from ledger.errors import InvalidInput, LedgerError
from ledger.signing import SigningKey, load_public_key
from ledger.small_file import read_small_file, read_small_text
from ledger.storage.database import Database, sqlite_file

# emoji=False: a record's ":white_check_mark:" is text, not an emoji (see shown()).
console = Console(soft_wrap=True, emoji=False)
err_console = Console(stderr=True, soft_wrap=True, emoji=False)
T = TypeVar("T")
_FILE_TROUBLE = {"file_not_readable", "not_a_regular_file", "file_too_large", "not_utf8"}

DbOption = typer.Option(
    None, "--db", help="database URL (default: LEDGER_DATABASE_URL, else the embedded SQLite)"
)
JsonOption = typer.Option(False, "--json", help="print JSON for scripts")
LogFormatOption = typer.Option(
    "text",
    "--log-format",
    envvar="LEDGER_LOG_FORMAT",
    help="log lines on stderr: text, or json (one object per line, with the request ID)",
    case_sensitive=False,
)
ApiOption = typer.Option(
    "http://127.0.0.1:8700", "--api", envvar="LEDGER_API_URL", help="ledger API base URL"
)
TokenFileOption = typer.Option(
    None,
    "--token-file",
    envvar="LEDGER_TOKEN_FILE",
    help="file holding a bearer token (default: the admin token file)",
)


# The option that sets a setting, where it is not the setting's name with dashes.
_OPTIONS = {"database_url": "--db"}


def load_settings(**overrides: Any) -> Settings:
    """The settings from the environment, with the options given (``overrides``, None: not
    given); an invalid one exits 2 naming the option or the variable that set it."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first.get("loc") or ()
        field = str(loc[0]) if loc else ""
        if field in given:
            name = f"{_OPTIONS.get(field, '--' + field.replace('_', '-'))}: "
        else:
            name = f"LEDGER_{field.upper()}: " if field else ""
        message = str(first.get("msg")).removeprefix("Value error, ")  # pydantic's prefix
        if message.startswith(name):  # a validator that names its variable itself
            name = ""
        fail(f"invalid settings: {name}{message}")


def open_database(url: str | None) -> tuple[Settings, Database]:
    """Open the configured database, whether or not it holds a ledger yet (``db upgrade``)."""
    settings = load_settings(database_url=url)
    return settings, Database(settings.resolved_database_url)


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
        migrations.check_no_other_tables(db)
        fail(f"no ledger schema in {db.describe()}: {hint}", 2)
    migrations.check_current(db)
    return settings, db


def token_file_or_default(path: Path | None) -> Path:
    return path or load_settings().resolved_admin_token_file


MAX_SECONDS = 1_000_000_000


def finite_seconds(value: float | None) -> float | None:
    """Option callback: a number of seconds must be finite (``inf`` and ``nan`` are refused)
    and not negative."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number of seconds")
    if value is not None and value < 0:
        raise typer.BadParameter(f"{value:g} s is negative")
    if value is not None and value > MAX_SECONDS:
        raise typer.BadParameter(f"{value:g} s is more than {MAX_SECONDS:,} s (31 years)")
    return value


def fail(message: str, code: int = 2) -> Any:
    """One line on stderr, then exit: 2 for usage or trouble (the default), 1 for a negative
    result (an invalid bundle, a finding, a verdict other than the one asked for)."""
    # Messages carry codes in brackets ("[engine_unreachable]"): print them, not as markup.
    # A driver's message may hold line breaks (psycopg's hint): one line all the same.
    err_console.print(f"[bold red]error:[/] {escape(' '.join(message.split()))}")
    raise typer.Exit(code)


@contextmanager
def ledger_errors(code: int = 2) -> Iterator[None]:
    """Print a LedgerError as a one-line message and exit with ``code``."""
    try:
        yield
    except CheckFailed as exc:  # something the demo or the GPU check shows did not hold
        fail(f"{exc.message} [{exc.code}]", 1)
    except LedgerError as exc:
        fail(f"{exc.message} [{exc.code}]", code)


def run(fn: Callable[[], T]) -> T:
    with ledger_errors():
        return fn()
    raise AssertionError("unreachable")


def when(value: datetime | str | None) -> str:
    """A time for people, in the CLI's one format: RFC 3339 in UTC to the second, with ``Z``
    (``2026-12-02T08:05:10Z``); "" for none. ``--json`` keeps every digit (:func:`when_json`)."""
    at = _utc(value)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ") if at is not None else ""


def when_json(value: datetime | str | None) -> str | None:
    """A time for scripts: RFC 3339 in UTC with ``Z`` and microseconds; None for none."""
    at = _utc(value)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if at is not None else None


def _utc(value: datetime | str | None) -> datetime | None:
    if value is None or value == "":
        return None
    at = datetime.fromisoformat(value) if isinstance(value, str) else value
    return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).astimezone(UTC)


def shown(value: object) -> str:
    """Data (a record's fields, a fingerprint's values, a server's message) safe to print as
    console markup: brackets escaped, and every character that is not printable (escape
    sequences, BEL, bidi overrides, zero-width and line separators) shown as ``\\xNN`` or
    ``\\uNNNN`` instead of reaching the terminal. (The consoles take no emoji codes.)"""
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escaped(c) for c in text)
    return escape(text)


def _escaped(c: str) -> str:
    code = ord(c)
    return (
        f"\\x{code:02x}"
        if code <= 0xFF
        else f"\\u{code:04x}"
        if code <= 0xFFFF
        else f"\\U{code:08x}"
    )


def show_progress(logger: str = "ledger.demo") -> None:
    """Print what a long scenario logs as it goes (``demo``, ``gpu-check``) on stderr."""
    target = logging.getLogger(logger)
    if not target.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        target.addHandler(handler)
    target.setLevel(logging.INFO)
    target.propagate = False


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def check_listen(host: str, port: int) -> None:
    """Before any work (a migration, a first-start token, a spool): every address the host
    names can be bound, as the server will bind them (asyncio binds each; uvicorn and it use
    ``SO_REUSEADDR`` as here). This only turns a port in use or a bad host into one line and
    exit 2, not a bare log line; the server binds again at once."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in addresses:
            try:
                probe = socket.socket(family, kind, proto)
            except OSError:  # a family this host cannot use: the server skips it too
                continue
            with probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(address)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        with ledger_errors():
            raise InvalidInput(
                f"cannot listen on {host}:{port}: {reason}", code="cannot_listen"
            ) from None


def refuse_existing(path: Path, force: bool) -> None:
    """Before any work: an output file (a bundle, a fingerprint) is never written over one
    already there unless ``--force``; the name might hold a key or an earlier bundle."""
    if not force and os.path.lexists(path):
        fail(f"{path} already exists; pass --force to replace it [file_exists]")


def write_output(path: Path, data: bytes, force: bool) -> None:
    """Write an output file whole or not at all; one line and exit 2 when it cannot be."""
    try:
        write_atomically(path, data, overwrite=force)
    except FileExistsError:
        fail(f"{path} already exists; pass --force to replace it [file_exists]")
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc} [file_not_writable]")


def read_signing_key(path: Path) -> SigningKey:
    """A private key from a PEM file; one line and exit 2 when it cannot be read."""
    try:
        return SigningKey.load(path)
    except LedgerError as exc:
        fail(_key_trouble(path, exc))
    raise AssertionError("unreachable")


def read_public_key(path: Path) -> Ed25519PublicKey:
    """A public key from a PEM file (a private key file yields its public half)."""
    try:
        data = read_small_file(path, "key")
        if b"PRIVATE" in data:
            return SigningKey.from_pem(data).public_key
        return load_public_key(data)
    except LedgerError as exc:
        fail(_key_trouble(path, exc))
    raise AssertionError("unreachable")


def _key_trouble(path: Path, exc: LedgerError) -> str:
    # A file that cannot be read names itself; a bad PEM is named here.
    text = exc.message if exc.code in _FILE_TROUBLE else f"cannot read key {path}: {exc.message}"
    return f"{text} [{exc.code}]"


def read_text_file(path: Path, what: str) -> str:
    """A small UTF-8 file named on the command line; one line and exit 2 when it cannot be."""
    try:
        return read_small_text(path, what)
    except LedgerError as exc:
        fail(f"{exc.message} [{exc.code}]")
    raise AssertionError("unreachable")
