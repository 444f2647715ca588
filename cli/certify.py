"""``ledger certify --pool P``: run the replay matrix on a pool and print its certificate."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from cli.common import (
    ApiOption,
    JsonOption,
    TokenFileOption,
    console,
    fail,
    ledger_errors,
    print_json,
    shown,
    token_file_or_default,
)
from cli.progress import progress
from cli.tables import table
from client.ledger_client import LedgerClient, read_token_file
from ledger.errors import Pushback

# How long a poll may keep failing transiently (the ledger restarting, its database briefly
# away) before the command gives up; a job outlives its process only as ``interrupted``.
RETRY_FOR = 60.0


def _ints(value: str, name: str) -> list[int]:
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        items = []
    if not items or any(i < 1 for i in items):
        fail(f"{name} must be a comma-separated list of positive integers, got {value!r}", 2)
    return items


def certify(
    pool: str = typer.Option(..., "--pool", help="the pool to certify"),
    prompts: int = typer.Option(8, "--prompts", min=1, max=256, help="probe prompts"),
    concurrency: str = typer.Option("1,8,32", "--concurrency", help="e.g. 1,8,32"),
    max_tokens: str = typer.Option("16,128", "--max-tokens", help="e.g. 16,128"),
    seed: int = typer.Option(0, "--seed", help="seed of the probe prompts"),
    api: str = ApiOption,
    token_file: Path | None = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Probe a pool alone and under concurrent load; exit 0 if every result was bitwise,
    1 if the pool is not batch-invariant (the table shows where), 2 on trouble."""
    payload = {
        "pool": pool,
        "prompts": prompts,
        "concurrency": _ints(concurrency, "--concurrency"),
        "max_tokens": _ints(max_tokens, "--max-tokens"),
        "seed": seed,
    }
    with (
        ledger_errors(code=2),
        LedgerClient(api, read_token_file(token_file_or_default(token_file))) as client,
    ):
        job = client.certify(payload)
        job = _follow(client, job, show=not as_json)
    if job["status"] != "done":
        error = job.get("error") or {}
        fail(f"certification failed: {error.get('message')} [{error.get('code')}]", 2)
    body = job["envelope"]["body"]
    if as_json:
        print_json(job)
    else:
        print_certificate(body, job["log_index"])
    raise typer.Exit(0 if body["invariant_observed"] else 1)


def _follow(client: LedgerClient, job: dict[str, Any], *, show: bool) -> dict[str, Any]:
    bar = progress(
        TextColumn(f"certifying pool {job['pool']}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        show=show,
    )
    with bar:
        task = bar.add_task("probes", total=job["total"])
        failing_since: float | None = None
        while job["status"] == "running":
            time.sleep(0.5)
            try:
                job = client.certification(job["certification_id"])
            except Pushback as exc:
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > RETRY_FOR:
                    raise
                time.sleep(min(exc.retry_after, 5.0))
                continue
            failing_since = None
            bar.update(task, completed=job["done"])
    return job


def print_certificate(body: dict[str, Any], log_index: int) -> None:
    out = table(
        "max_tokens",
        "concurrency",
        "requests",
        "exact tokens",
        "bitwise",
        "first divergences",
        "min margin",
        "min margin at divergence",
        wrap=["first divergences"],
        title=f"pool {shown(body['pool'])} · worker {shown(body['worker_id'])} · "
        f"batch_invariance {shown(body['batch_invariance'])}",
    )
    for r in body["results"]:
        firsts = r["first_divergences"]
        out.add_row(
            str(r["max_tokens"]),
            str(r["concurrency"]),
            str(r["requests"]),
            f"{r['exact_token_rate']:.0%}",
            f"{r['bitwise_rate']:.0%}",
            ", ".join(map(str, firsts[:8])) + (" …" if len(firsts) > 8 else "") or "-",
            _fmt(r["min_margin"]),
            _fmt(r["min_margin_at_divergence"]),
        )
    console.print(out)
    verdict = (
        "[bold green]invariant: every result bitwise equal to its run alone[/]"
        if body["invariant_observed"]
        else "[bold yellow]NOT invariant: results depend on what runs beside them[/]"
    )
    console.print(
        f"{verdict}\ncertificate {shown(body['certificate_id'])} for "
        f"{shown(body['fingerprint_id'])} is log leaf {log_index}"
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
