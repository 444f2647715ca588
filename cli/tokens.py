"""``ledger tokens``: bearer tokens, managed directly in the ledger's database."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.markup import escape

from cli.common import (
    DbOption,
    JsonOption,
    console,
    fail,
    ledger_errors,
    open_existing_database,
    print_json,
    when,
    when_json,
)
from cli.tables import table
from ledger import secretfile
from ledger.storage import tokenstore
from ledger.tokens import EXPIRY_FORMS, SCOPES, parse_expiry

app = typer.Typer(help="API bearer tokens (stored hashed).", no_args_is_help=True)
Scope = enum.Enum("Scope", {s: s for s in SCOPES}, type=str)  # type: ignore[misc]


@app.command("create")
def create(
    scope: list[Scope] = typer.Option(..., "--scope", help="repeatable: a scope the token carries"),
    name: str = typer.Option("cli", help="a label for the token"),
    expires: str | None = typer.Option(
        None, "--expires", help=f"when the token stops working: {EXPIRY_FORMS}; default never"
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="write the token to this new file (mode 0600; an existing file or symlink is "
        "refused unless --force)",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="with --out: replace an existing file (a symlink itself, never its target)",
    ),
    db_url: str | None = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Create a token. The secret is shown (or written) once; only its hash is kept."""
    if force and out is None:
        fail("--force only applies with --out")
    with ledger_errors():
        expires_at = parse_expiry(expires, datetime.now(UTC)) if expires is not None else None
        token = tokenstore.prepare_token(name, [s.value for s in scope], expires_at)
        _, db = open_existing_database(db_url)
        # The file is written (not yet visible) before the token is stored, so a token whose
        # secret could not be kept is never created; it appears once the token exists.
        staged = None
        if out is not None:
            try:
                staged = secretfile.stage_secret_file(out, token.secret + "\n", overwrite=force)
            except secretfile.SecretFileExists as exc:
                fail(
                    f"{exc.message} (--force replaces it: a symlink itself, never its target) "
                    f"[{exc.code}]"
                )
        try:
            info = tokenstore.store_token(db, token)
            if staged is not None:
                try:
                    staged.publish()
                except BaseException:
                    tokenstore.delete_token(db, info.token_id)
                    raise
        finally:
            if staged is not None and not staged.published:
                staged.discard()
    if as_json:
        payload = {
            "token_id": info.token_id,
            "name": info.name,
            "scopes": list(info.scopes),
            "expires_at": when_json(info.expires_at),
        }
        print_json(payload if out else {**payload, "token": token.secret})
        return
    until = f", expires {when(info.expires_at)}" if info.expires_at else ""
    console.print(
        f"token {info.token_id} ({escape(info.name)}) scopes: {', '.join(info.scopes)}{until}"
    )
    console.print(f"written to {out}" if out else token.secret)


@app.command("list")
def list_tokens(db_url: str | None = DbOption, as_json: bool = JsonOption) -> None:
    """List tokens (IDs, names, scopes, expiry; never secrets)."""
    with ledger_errors():
        _, db = open_existing_database(db_url)
        items = tokenstore.list_tokens(db)
    now = datetime.now(UTC)
    if as_json:
        print_json(
            [
                {
                    "token_id": t.token_id,
                    "name": t.name,
                    "scopes": list(t.scopes),
                    "created_at": when_json(t.created_at),
                    "revoked_at": when_json(t.revoked_at),
                    "expires_at": when_json(t.expires_at),
                    "expired": t.expired(now),
                }
                for t in items
            ]
        )
        return
    out = table("token ID", "name", "scopes", "created", "expires", "revoked", wrap=["scopes"])
    for t in items:
        expiry = ""
        if t.expires_at is not None:
            expiry = when(t.expires_at) + (" (expired)" if t.expired(now) else "")
        out.add_row(
            t.token_id,
            escape(t.name),
            ", ".join(t.scopes),
            when(t.created_at),
            expiry,
            when(t.revoked_at),
        )
    console.print(out)


@app.command("revoke")
def revoke(
    token_id: str = typer.Argument(..., help="the token's ID, as `tokens list` shows it"),
    db_url: str | None = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Revoke a token by its ID."""
    with ledger_errors():
        _, db = open_existing_database(db_url)
        info = tokenstore.revoke_token(db, token_id)
    if as_json:
        print_json({"token_id": info.token_id, "revoked_at": when_json(info.revoked_at)})
        return
    console.print(f"token {info.token_id} revoked at {when(info.revoked_at)}")
