"""``ledger erase``: erase a record's content, or every record a filter matches (dry run first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

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
from cli.tables import table
from client.ledger_client import LedgerClient, read_token_file


def erase(
    request_id: str | None = typer.Argument(
        None, help="the record to erase; omit it and give filters to erase by search"
    ),
    reason: str = typer.Option(..., "--reason", help="why (logged in the signed event)"),
    model: str | None = typer.Option(None, "--model", help="bulk: records of this model"),
    pool: str | None = typer.Option(None, "--pool", help="bulk: records of this pool"),
    tier: int | None = typer.Option(None, "--tier", min=0, max=2, help="bulk: of this tier"),
    fingerprint_id: str | None = typer.Option(
        None, "--fingerprint", help="bulk: records under this fingerprint ID"
    ),
    since: str | None = typer.Option(None, "--since", help="bulk: received at or after (RFC 3339)"),
    until: str | None = typer.Option(None, "--until", help="bulk: received before (RFC 3339)"),
    yes: bool = typer.Option(
        False, "--yes", help="bulk: erase for real (without it, a dry run lists what would be)"
    ),
    api: str = ApiOption,
    token_file: Path | None = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Erase records' content: their disclosures and cache keys go, a signed erasure event
    stays in the log. Needs a token with the `erasure` scope."""
    flt = {
        k: v
        for k, v in (
            ("model", model),
            ("pool", pool),
            ("tier", tier),
            ("fingerprint_id", fingerprint_id),
            ("since", since),
            ("until", until),
        )
        if v is not None
    }
    if (request_id is None) == (not flt):
        fail("give either a REQUEST_ID or at least one filter (--model, --pool, --since, ...)")
    with (
        ledger_errors(),
        LedgerClient(api, read_token_file(token_file_or_default(token_file))) as c,
    ):
        if request_id is not None:
            out = c.erase(request_id, reason)
            if as_json:
                print_json(out)
                return
            verb = "erased" if out["status"] == "erased" else "was already erased"
            console.print(
                f"{request_id}: content {verb} ({out['erased_digests']} disclosure digests); "
                f"erasure event at leaf {out['log_index']}"
            )
            return
        result = c.erase_matching(flt, reason, dry_run=not yes)
    if as_json:
        print_json(result)
        return
    _print_bulk(result)


def _print_bulk(result: dict[str, Any]) -> None:
    dry = result["dry_run"]
    out = table("request ID", "outcome", wrap=["outcome"])
    for rid in result["erased"]:
        out.add_row(rid, "would be erased" if dry else "erased")
    for rid in result["held"]:
        out.add_row(rid, "kept: under legal hold")
    console.print(out)
    console.print(
        f"{len(result['erased'])} record(s) {'would be ' if dry else ''}erased, "
        f"{len(result['held'])} held, {result['not_erasable']} not erasable (schema v1)"
        + ("; run again with --yes to erase them" if dry and result["erased"] else "")
    )
