"""``ledger keys``: create Ed25519 key pairs, register and revoke them with the ledger."""

from __future__ import annotations

from pathlib import Path

import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from rich.table import Table

from cli.common import (
    ApiOption,
    JsonOption,
    TokenFileOption,
    console,
    fail,
    ledger_errors,
    print_json,
    token_file_or_default,
)
from collectors.ledger_client import LedgerClient, read_token_file
from ledger.signing import SigningKey, key_id_for, load_public_key, public_key_pem

app = typer.Typer(help="Signing keys (Ed25519).", no_args_is_help=True)


@app.command("new")
def new(
    name: str = typer.Argument(..., help="key name; writes NAME.pem and NAME.pub.pem"),
    directory: Path = typer.Option(Path("."), "--dir", help="where to write the PEM files"),
    as_json: bool = JsonOption,
) -> None:
    """Write a new Ed25519 key pair (private key mode 0600; never overwrites)."""
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    for path in (private, public):
        if path.exists():
            fail(f"{path} already exists; refusing to overwrite a key")
    key = SigningKey.generate()
    key.write(private, public)
    if as_json:
        print_json({"key_id": key.key_id, "private_key": str(private), "public_key": str(public)})
    else:
        console.print(f"key ID       {key.key_id}")
        console.print(f"private key  {private}")
        console.print(f"public key   {public}")


@app.command("show")
def show(path: Path = typer.Argument(..., help="a private or public key PEM")) -> None:
    """Print a key file's key ID and public key."""
    with ledger_errors():
        pub = _public_from_file(path)
        console.print(f"key ID  {key_id_for(pub)}")
        console.print(public_key_pem(pub).strip())


def _public_from_file(path: Path) -> Ed25519PublicKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}")
    return SigningKey.from_pem(data).public_key if b"PRIVATE" in data else load_public_key(data)


def _client(api: str, token_file: Path | None) -> LedgerClient:
    return LedgerClient(api, read_token_file(token_file_or_default(token_file)))


@app.command("register")
def register(
    public_key: Path = typer.Argument(..., help="public (or private) key PEM to register"),
    name: str = typer.Option(..., help="a name for the key"),
    role: str = typer.Option("collector", help="collector | replayer"),
    api: str = ApiOption,
    token_file: Path | None = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Register a public key with the ledger (admin token)."""
    with ledger_errors():
        pub = _public_from_file(public_key)
        with _client(api, token_file) as client:
            info = client.register_key(name, role, public_key_pem(pub))
    if as_json:
        print_json(info)
    else:
        console.print(f"registered {info['key_id']} as {info['name']!r} ({info['role']})")


@app.command("revoke")
def revoke(
    key_id: str = typer.Argument(...),
    reason: str = typer.Option(..., help="why (kept in the log)"),
    api: str = ApiOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Revoke a key: envelopes it signs from now on are refused."""
    with ledger_errors(), _client(api, token_file) as client:
        info = client.revoke_key(key_id, reason)
    console.print(f"revoked {info['key_id']} at {info['revoked_at']}")


@app.command("list")
def list_keys(
    api: str = ApiOption, token_file: Path | None = TokenFileOption, as_json: bool = JsonOption
) -> None:
    """List the keys registered with the ledger."""
    with ledger_errors(), _client(api, token_file) as client:
        items = client.list_keys()
    if as_json:
        print_json(items)
        return
    table = Table("key ID", "name", "role", "registered", "revoked")
    for k in items:
        table.add_row(
            k["key_id"][:24] + "…",
            k["name"],
            k["role"],
            k["registered_at"][:19],
            k["revoked_at"] or "",
        )
    console.print(table)
