"""``ledger keys``: create Ed25519 key pairs, register and revoke them with the ledger."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import typer
from rich.markup import escape

from cli.common import (
    ApiOption,
    JsonOption,
    TokenFileOption,
    console,
    fail,
    ledger_errors,
    load_settings,
    print_json,
    read_public_key,
    token_file_or_default,
    when,
)
from cli.tables import table
from client.ledger_client import LedgerClient, read_token_file
from ledger.errors import InvalidInput, LedgerError
from ledger.secretfile import SecretFileExists
from ledger.signing import SigningKey, key_id_for, public_key_pem
from ledger.storage.checkpoints import default_origin
from ledger.storage.proofs import log_key_entry

app = typer.Typer(help="Signing keys (Ed25519).", no_args_is_help=True)
# A key pair's file name stem: never a path (no separator, no leading dot, no control character).
_KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@app.command("new")
def new(
    name: str = typer.Argument(..., help="key name; writes NAME.pem and NAME.pub.pem"),
    directory: Path = typer.Option(Path("."), "--dir", help="where to write the PEM files"),
    force: bool = typer.Option(
        False, "--force", help="replace existing files (a symlink itself, never its target)"
    ),
    as_json: bool = JsonOption,
) -> None:
    """Write a new Ed25519 key pair: the private key mode 0600, the public 0644, each atomic
    and never through a symlink; existing files are refused unless --force."""
    if not _KEY_NAME.fullmatch(name):
        with ledger_errors():
            raise InvalidInput(
                f"key name {name!r} must be 1-100 of A-Za-z0-9 . _ - and start with a letter "
                "or digit: it names the files in --dir",
                code="invalid_name",
            )
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    key = SigningKey.generate()
    try:
        key.write(private, public, overwrite=force)
    except SecretFileExists as exc:
        fail(
            f"{exc.message} (--force replaces it: a symlink itself, never its target) [{exc.code}]"
        )
    except LedgerError as exc:
        fail(f"{exc.message} [{exc.code}]")
    if as_json:
        print_json({"key_id": key.key_id, "private_key": str(private), "public_key": str(public)})
    else:
        console.print(f"key ID       {key.key_id}")
        console.print(f"private key  {private}")
        console.print(f"public key   {public}")


@app.command("show")
def show(
    path: Path = typer.Argument(..., help="a private or public key PEM"),
    as_json: bool = JsonOption,
) -> None:
    """Print a key file's key ID and public key."""
    with ledger_errors():
        pub = read_public_key(path)
    if as_json:
        print_json({"key_id": key_id_for(pub), "pem": public_key_pem(pub)})
        return
    console.print(f"key ID  {key_id_for(pub)}")
    console.print(public_key_pem(pub).strip())


def _client(api: str, token_file: Path | None) -> LedgerClient:
    return LedgerClient(api, read_token_file(token_file_or_default(token_file)))


@app.command("register")
def register(
    public_key: Path = typer.Argument(..., help="public (or private) key PEM to register"),
    name: str = typer.Option(..., help="a name for the key"),
    role: Literal["collector", "replayer"] = typer.Option(
        "collector", help="what the key may sign: records and fingerprints, or replay outputs"
    ),
    pool: list[str] | None = typer.Option(
        None,
        "--pool",
        help="a pool the collector key may sign records and heartbeats for (repeat for more); "
        "without it, any pool",
    ),
    api: str = ApiOption,
    token_file: Path | None = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Register a public key with the ledger (admin token)."""
    with ledger_errors():
        pub = read_public_key(public_key)
        with _client(api, token_file) as client:
            info = client.register_key(name, role, public_key_pem(pub), pool or None)
    if as_json:
        print_json(info)
    else:
        scope = "any pool" if info.get("pools") is None else "pools " + ", ".join(info["pools"])
        console.print(
            f"registered {info['key_id']} as {info['name']!r} ({info['role']}, {scope})",
            markup=False,
        )


@app.command("revoke")
def revoke(
    key_id: str = typer.Argument(
        ..., help="the key's full ID (ed25519:<64 hex>), as `keys list` shows it"
    ),
    reason: str = typer.Option(..., help="why (kept in the log)"),
    api: str = ApiOption,
    token_file: Path | None = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Revoke a key: envelopes it signs from now on are refused."""
    with ledger_errors(), _client(api, token_file) as client:
        info = client.revoke_key(key_id, reason)
    if as_json:
        print_json(info)
        return
    console.print(f"revoked {info['key_id']} at {when(info['revoked_at'])}")


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
    out = table("key ID", "name", "role", "pools", "registered", "revoked", wrap=["pools"])
    for k in items:
        pools = k.get("pools")
        out.add_row(
            escape(str(k["key_id"])),
            escape(str(k["name"])),
            escape(str(k["role"])),
            "any" if pools is None else escape(", ".join(pools)),
            when(k["registered_at"]),
            when(k["revoked_at"]),
        )
    console.print(out)


@app.command("show-log")
def show_log(
    api: str | None = typer.Option(
        None,
        "--api",
        envvar="LEDGER_API_URL",
        help="ask a running ledger for its log key (unless --key-file is given)",
    ),
    key_file: Path | None = typer.Option(
        None,
        "--key-file",
        help="read a local log key (without --api or LEDGER_API_URL: LEDGER_LOG_KEY_FILE)",
    ),
    as_json: bool = JsonOption,
) -> None:
    """Print the ledger's log public key (PEM, key ID and C2SP verifier key)."""
    with ledger_errors():
        if api is not None and key_file is None:
            with LedgerClient(api) as client:
                info = client.log_key()
        else:
            settings = load_settings()
            path = key_file or settings.resolved_log_key_file
            if not path.exists():
                fail(f"no log key at {path}; start the ledger once or pass --api")
            key = SigningKey.load(path)
            origin = settings.log_origin or default_origin(key)
            info = {**log_key_entry(key, origin), "pem": public_key_pem(key.public_key)}
    if as_json:
        print_json(info)
        return
    console.print(f"key ID  {info['key_id']}")
    console.print(f"origin  {info['origin']}")
    console.print(f"vkey    {info['vkey']}")
    console.print(info["pem"].strip())
