"""``ledger evidence``: fetch a record's evidence bundle from the API."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cli.common import (
    ApiOption,
    TokenFileOption,
    console,
    fail,
    ledger_errors,
    token_file_or_default,
)
from collectors.ledger_client import LedgerClient, read_token_file


def evidence(
    request_id: str = typer.Argument(...),
    out: Path = typer.Option(..., "--out", "-o", help="where to write the bundle"),
    api: str = ApiOption,
    token_file: Path | None = TokenFileOption,
) -> None:
    """Download the evidence bundle of a record (verify it with `ledger verify`)."""
    with (
        ledger_errors(),
        LedgerClient(api, read_token_file(token_file_or_default(token_file))) as c,
    ):
        bundle = c.evidence(request_id)
    try:
        out.write_text(json.dumps(bundle, indent=2) + "\n")
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror}")
    fingerprint = bundle.get("fingerprint") or {}
    with_fp = f", its fingerprint at leaf {fingerprint['leaf_index']}" if fingerprint else ""
    console.print(
        f"wrote {out}: leaf {bundle['leaf_index']} of {bundle['inclusion_proof']['tree_size']}"
        f"{with_fp}; check it with `ledger verify {out} --log-key LOG_KEY.pem`"
    )
