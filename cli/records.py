"""``ledger records``: search the ledger's records from a terminal (as the console does)."""

from __future__ import annotations

import enum
import json
import sys
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
    shown,
    token_file_or_default,
    when,
)
from cli.tables import table
from client.ledger_client import LedgerClient, read_token_file
from ledger import record_export
from ledger.compare import VERDICTS

# What --verdict and --content accept (the API's filters: ledger.storage.record_search).
Verdict = enum.Enum("Verdict", {v: v for v in (*VERDICTS, "none")}, type=str)  # type: ignore[misc]
Content = enum.Enum("Content", {c: c for c in ("complete", "erased", "in_log")}, type=str)  # type: ignore[misc]

app = typer.Typer(help="Records: search them (as the console does).", no_args_is_help=True)
PAGE = 500


@app.callback()
def _group() -> None:  # a group of one command for now: `ledger records search`
    pass


@app.command("search")
def search(
    since: str | None = typer.Option(None, "--since", help="received at or after (RFC 3339)"),
    until: str | None = typer.Option(None, "--until", help="received before (RFC 3339)"),
    model: str | None = typer.Option(None, "--model", help="the model name as recorded"),
    pool: str | None = typer.Option(None, "--pool", help="the pool that served it"),
    worker: str | None = typer.Option(None, "--worker", help="the worker ID that served it"),
    tier: int | None = typer.Option(None, "--tier", min=0, max=2, help="determinism tier"),
    fingerprint: str | None = typer.Option(None, "--fingerprint", help="sha256:… fingerprint"),
    verdict: Verdict | None = typer.Option(
        None, "--verdict", help="a logged replay verdict, or none (never replayed)"
    ),
    aborted: bool | None = typer.Option(
        None, "--aborted/--not-aborted", help="only records whose client left (or did not)"
    ),
    content: Content | None = typer.Option(
        None, "--content", help="the content's state (in_log: schema v1, inside its leaf)"
    ),
    held: bool | None = typer.Option(
        None, "--held/--not-held", help="only records a legal hold covers (or does not)"
    ),
    limit: int = typer.Option(100, "--limit", min=1, help="at most this many records"),
    newest: bool = typer.Option(False, "--newest", help="newest first (default: log order)"),
    as_csv: bool = typer.Option(False, "--csv", help="print CSV (the console's export columns)"),
    api: str = ApiOption,
    token_file: Path | None = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Search records by time, model, pool, worker, tier, fingerprint, verdict and state."""
    if as_csv and as_json:
        fail("choose one of --csv and --json")
    params: dict[str, Any] = {
        "since": since,
        "until": until,
        "model": model,
        "pool": pool,
        "worker_id": worker,
        "tier": tier,
        "fingerprint_id": fingerprint,
        "verdict": verdict.value if verdict else None,
        "aborted": None if aborted is None else str(aborted).lower(),
        "content": content.value if content else None,
        "held": None if held is None else str(held).lower(),
        "order": "newest" if newest else "log",
        "fields": "meta",
    }
    items: list[dict[str, Any]] = []
    with (
        ledger_errors(),
        LedgerClient(api, read_token_file(token_file_or_default(token_file))) as c,
    ):
        cursor = None
        while len(items) < limit:
            page = c.search_records(**params, limit=min(PAGE, limit - len(items)), cursor=cursor)
            items.extend(page["items"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
    items = items[:limit]
    if as_json:
        found = {"items": items, "count": len(items), "next_cursor": cursor}
        sys.stdout.write(json.dumps(found, indent=2) + "\n")
        return
    if as_csv:
        sys.stdout.write(record_export.csv_header())
        sys.stdout.writelines(record_export.csv_line(i) for i in items)
        return
    t = table("received", "request ID", "model", "pool", "tier", "verdict", "state", wrap=["state"])
    for i in items:
        state = [s for s, on in (("aborted", i["aborted"]), ("held", i.get("held_by"))) if on]
        if i["content"] == "erased":
            state.append("erased")
        t.add_row(
            when(i["received_at"]),
            shown(i["request_id"]),
            shown(i["model"]),
            shown(i["pool"]),
            shown(i["tier"]),
            shown(i.get("verdict") or "-"),
            ", ".join(state) or "-",
        )
    console.print(t)
    more = " (more match: raise --limit)" if cursor is not None and len(items) == limit else ""
    console.print(f"{len(items)} record(s){more}")
