"""``ledger tokens``: bearer tokens, managed directly in the ledger's database."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from api.bootstrap import write_secret
from cli.common import (
    DbOption,
    JsonOption,
    console,
    fail,
    ledger_errors,
    open_database,
    print_json,
)
from ledger.storage import tokenstore
from ledger.tokens import SCOPES

app = typer.Typer(help="API bearer tokens (stored hashed).", no_args_is_help=True)


@app.command("create")
def create(
    scope: list[str] = typer.Option(..., "--scope", help=f"repeatable: {', '.join(SCOPES)}"),
    name: str = typer.Option("cli", help="a label for the token"),
    out: Path | None = typer.Option(None, "--out", help="write the token to this file (0600)"),
    db_url: str | None = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Create a token. The secret is shown (or written) once; only its hash is kept."""
    if out is not None:  # fail before creating a token whose secret could not be kept
        try:
            write_secret(out, "")
        except OSError as exc:
            fail(f"cannot write {out}: {exc.strerror}")
    with ledger_errors():
        _, db = open_database(db_url, migrate=True)
        secret, info = tokenstore.create_token(db, name, scope)
    if out is not None:
        write_secret(out, secret)
    if as_json:
        payload = {"token_id": info.token_id, "name": info.name, "scopes": list(info.scopes)}
        print_json(payload if out else {**payload, "token": secret})
        return
    console.print(f"token {info.token_id} ({info.name}) scopes: {', '.join(info.scopes)}")
    console.print(f"written to {out}" if out else secret)


@app.command("list")
def list_tokens(db_url: str | None = DbOption, as_json: bool = JsonOption) -> None:
    """List tokens (IDs, names and scopes; never secrets)."""
    with ledger_errors():
        _, db = open_database(db_url, migrate=True)
        items = tokenstore.list_tokens(db)
    if as_json:
        print_json(
            [
                {
                    "token_id": t.token_id,
                    "name": t.name,
                    "scopes": list(t.scopes),
                    "created_at": t.created_at.isoformat(),
                    "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
                }
                for t in items
            ]
        )
        return
    table = Table("token ID", "name", "scopes", "created", "revoked")
    for t in items:
        table.add_row(
            t.token_id,
            t.name,
            ", ".join(t.scopes),
            t.created_at.isoformat()[:19],
            t.revoked_at.isoformat()[:19] if t.revoked_at else "",
        )
    console.print(table)


@app.command("revoke")
def revoke(token_id: str, db_url: str | None = DbOption) -> None:
    """Revoke a token by its ID."""
    with ledger_errors():
        _, db = open_database(db_url, migrate=True)
        info = tokenstore.revoke_token(db, token_id)
    console.print(f"token {info.token_id} revoked at {info.revoked_at}")
