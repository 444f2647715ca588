"""``ledger replay REQUEST_ID``: re-run a recorded request and print the signed verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cli.common import (
    ApiOption,
    JsonOption,
    TokenFileOption,
    console,
    ledger_errors,
    print_json,
    shown,
    token_file_or_default,
)
from cli.tables import table
from client.ledger_client import LedgerClient, read_token_file
from ledger.errors import Conflict

# Exit status: 0 bitwise, 1 any other verdict (the figures say what differed), 2 trouble.
REPRODUCED = "bitwise"


def replay(
    request_id: str = typer.Argument(..., help="the recorded request's ID"),
    pool: str | None = typer.Option(None, "--pool", help="replay only on this pool"),
    force: bool = typer.Option(
        False, "--force", help="replay on --pool even if it does not match (not_comparable)"
    ),
    api: str = ApiOption,
    token_file: Path | None = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Replay a request on a matching batch-invariant pool; exit 0 only when bitwise."""
    with (
        ledger_errors(code=2),
        LedgerClient(
            api, read_token_file(token_file_or_default(token_file)), timeout=600
        ) as client,
    ):
        try:
            result = client.replay(request_id, pool, force)
        except Conflict as exc:
            if "nearest_pools" in exc.details:  # no_matching_pool: what a matching pool lacks
                if as_json:
                    print_json({"error": exc.to_dict()})
                else:
                    _print_nearest(exc.details["nearest_pools"])
            raise
    verdict = result["envelope"]["body"]
    if as_json:
        print_json(result)
    else:
        print_verdict(result["replay_id"], result["log_index"], verdict)
    raise typer.Exit(0 if verdict["verdict"] == REPRODUCED else 1)


def print_verdict(replay_id: str, log_index: int, verdict: dict[str, Any]) -> None:
    style = "green" if verdict["verdict"] == REPRODUCED else "yellow"
    console.print(
        f"[bold {style}]{shown(verdict['verdict'])}[/]  {shown(verdict['request_id'])} replayed "
        f"on pool {shown(verdict['pool'])} (worker {shown(verdict['worker_id'])}); verdict "
        f"{shown(replay_id)} is log leaf {log_index}"
    )
    if verdict.get("reason"):
        console.print(f"reason: {shown(verdict['reason'])}")
    comparison = verdict.get("comparison")
    if comparison:
        out = table(
            "choice",
            "tokens rec/rep",
            "first divergence",
            "logprobs differing",
            "max |Δ logprob|",
            "top-2 margin there",
            "verdict",
        )
        for c in comparison["choices"]:
            out.add_row(
                str(c["index"]),
                f"{c['recorded_tokens']}/{c['replayed_tokens']}",
                _dash(c["first_divergence"]),
                f"{c['logprobs_differing']}/{c['logprobs_compared']}",
                _dash(c["max_abs_logprob_delta"]),
                _dash(c["top2_margin_at_divergence"]),
                shown(c["verdict"]),
            )
        console.print(out)
        if not comparison["prompt_equal"]:
            console.print("[yellow]prompt token IDs differ: tokenizer or template drift[/]")
    for d in (verdict.get("fingerprint_diff") or [])[:15]:
        console.print(
            f"  {shown(d['path'])}: {shown(repr(d['before']))} -> {shown(repr(d['after']))}  "
            f"({shown(d['impact'])})"
        )


def _dash(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _print_nearest(pools: list[dict[str, Any]]) -> None:
    """The pools nearest to the record's fingerprint, on stdout (the error line goes to stderr)."""
    if pools:
        console.print("nearest pools:")
    for p in pools:
        console.print(
            f"  pool {shown(p['pool'])} ({shown(p['batch_invariance'])}): "
            f"{shown(p['differences'])} differences"
        )
        for d in p["diff"][:8]:
            console.print(
                f"    {shown(d['path'])}: {shown(repr(d['before']))} -> {shown(repr(d['after']))}"
            )
