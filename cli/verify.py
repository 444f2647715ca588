"""``ledger verify``: check an evidence bundle fully offline."""

from __future__ import annotations

from pathlib import Path

import orjson
import typer

from cli.common import JsonOption, console, err_console, fail, print_json, read_public_key
from ledger.errors import VerificationError
from ledger.evidence import CHECKS, verify_bundle


def verify(
    bundle: Path = typer.Argument(..., help="evidence bundle (JSON)"),
    log_key: Path | None = typer.Option(
        None, "--log-key", help="the log's public key (PEM), pinned out of band"
    ),
    as_json: bool = JsonOption,
) -> None:
    """Verify a bundle offline: JCS, collector signature, inclusion proof, checkpoint signature.

    Exit 0 when valid; exit 1 naming the check that failed.
    """
    try:
        data = orjson.loads(bundle.read_bytes())
    except (OSError, ValueError) as exc:  # orjson.JSONDecodeError is a ValueError
        fail(f"cannot read bundle {bundle}: {exc}")
    pinned = read_public_key(log_key) if log_key is not None else None
    try:
        result = verify_bundle(data, pinned)
    except VerificationError as exc:
        check = exc.details.get("check", "unknown")
        if as_json:
            print_json({"valid": False, "check": check, "code": exc.code, "message": exc.message})
        else:
            err_console.print(
                f"[bold red]INVALID[/] check failed: [bold]{check}[/] — {exc.message}"
            )
        raise typer.Exit(1) from None
    if as_json:
        print_json(
            {
                "valid": True,
                "checks": list(CHECKS),
                "request_id": result.request_id,
                "leaf_index": result.leaf_index,
                "tree_size": result.tree_size,
                "origin": result.origin,
                "collector_key_id": result.collector_key_id,
                "log_key_id": result.log_key_id,
                "log_key_pinned": result.log_key_pinned,
                "replay_verdicts": list(result.replay_verdicts),
            }
        )
        return
    console.print(f"[bold green]VALID[/] {result.kind} {result.request_id}")
    console.print(f"  leaf {result.leaf_index} of {result.tree_size} in {result.origin}")
    console.print(f"  signed by collector key {result.collector_key_id}")
    console.print(f"  checkpoint signed by log key {result.log_key_id}")
    if result.replay_verdicts:
        console.print(f"  replay verdicts (signed, logged): {', '.join(result.replay_verdicts)}")
    if not result.log_key_pinned:
        err_console.print(
            "[yellow]warning:[/] the log key was taken from the bundle itself; pin it with "
            "--log-key to rule out a forged log"
        )
