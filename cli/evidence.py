"""``ledger evidence``: fetch a record's evidence bundle from the API."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cli.common import (
    ApiOption,
    JsonOption,
    TokenFileOption,
    console,
    fail,
    ledger_errors,
    print_json,
    refuse_existing,
    shown,
    token_file_or_default,
    write_output,
)
from client.ledger_client import LedgerClient, read_token_file


def evidence(
    request_id: str = typer.Argument(..., help="the record's request ID (its X-Request-ID)"),
    out: Path = typer.Option(..., "--out", "-o", help="the file to write the bundle to"),
    redact: str | None = typer.Option(
        None,
        "--redact",
        help="comma-separated content members or groups to leave out: prompt, output, "
        "token_ids, text, logprobs, request, request_raw, choices[N].text, ...",
    ),
    force: bool = typer.Option(False, "--force", help="replace a file already at --out"),
    api: str = ApiOption,
    token_file: Path | None = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Download the evidence bundle of a record (verify it with `ledger verify`)."""
    if str(out) == "-":
        fail("-o - names no file: the bundle is written to a file (-o bundle.json)")
    refuse_existing(out, force)
    with (
        ledger_errors(),
        LedgerClient(api, read_token_file(token_file_or_default(token_file))) as c,
    ):
        names = [n.strip() for n in (redact or "").split(",") if n.strip()]
        bundle = c.evidence(request_id, names or None)
    write_output(out, (json.dumps(bundle, indent=2) + "\n").encode(), force)
    fingerprint = bundle.get("fingerprint") or {}
    if as_json:
        print_json(
            {
                "path": str(out),
                "request_id": request_id,
                "leaf_index": bundle["leaf_index"],
                "tree_size": bundle["inclusion_proof"]["tree_size"],
                "fingerprint_leaf_index": fingerprint.get("leaf_index"),
                "disclosures": len(bundle.get("disclosures", [])),
                "erased": "erasure" in bundle,
            }
        )
        return
    at = fingerprint.get("leaf_index")
    with_fp = f", its fingerprint at leaf {shown(at)}" if at is not None else ""
    console.print(
        f"wrote {shown(out)}: leaf {bundle['leaf_index']} of "
        f"{bundle['inclusion_proof']['tree_size']}{with_fp}; check it with "
        f"`ledger verify {shown(out)} --log-key LOG_KEY.pem`"
    )
