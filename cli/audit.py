"""``ledger audit``: rebuild the log from the database and check every row against it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

from cli.common import (
    DbOption,
    JsonOption,
    console,
    fail,
    finite_seconds,
    ledger_errors,
    open_existing_database,
    print_json,
    read_public_key,
    read_text_file,
    shown,
)
from cli.progress import progress
from cli.tables import table
from ledger.audit import DEFAULT_CLOCK_TOLERANCE, AuditReport
from ledger.checkpoint import parse_checkpoint
from ledger.errors import VerificationError
from ledger.storage.audit import audit

# More processes than this only add start-up and memory: each verifies on a CPU of its own.
MAX_WORKERS = 4 * (os.cpu_count() or 1)


def run_audit(
    db_url: str | None = DbOption,
    log_key: Path | None = typer.Option(
        None, "--log-key", help="pin the log's public key (PEM); default: the log's first leaf"
    ),
    checkpoint: list[Path] = typer.Option(
        [],
        "--checkpoint",
        help="a checkpoint seen earlier (a signed note, or an evidence bundle holding one): "
        "the log must still hold its tree; repeatable",
    ),
    workers: int = typer.Option(
        os.cpu_count() or 1,
        "--workers",
        min=1,
        max=MAX_WORKERS,
        help=f"processes verifying signatures (at most {MAX_WORKERS}: 4 per CPU)",
    ),
    structure_only: bool = typer.Option(
        False,
        "--structure-only",
        help="skip per-leaf JSON, canonical-form, signature and index-table checks "
        "(needs --log-key)",
    ),
    checkpoint_interval: float | None = typer.Option(
        None,
        "--checkpoint-interval",
        callback=finite_seconds,
        help="seconds between the ledger's checkpoints (default: LEDGER_CHECKPOINT_INTERVAL, "
        "else 1): leaves older than this plus the clock tolerance must be covered by one",
    ),
    clock_tolerance: float = typer.Option(
        DEFAULT_CLOCK_TOLERANCE,
        "--clock-tolerance",
        callback=finite_seconds,
        help="seconds by which ledger hosts' clocks may differ (receive times vs checkpoints)",
    ),
    as_json: bool = JsonOption,
) -> None:
    """Recompute leaves, tree, checkpoints, signatures, index tables and receive times; exit 1
    on any discrepancy."""
    pinned = read_public_key(log_key) if log_key is not None else None
    trusted = [_read_checkpoint(path) for path in checkpoint]
    with ledger_errors():
        settings, db = open_existing_database(db_url)
        options = {
            "signatures": not structure_only,
            "trusted_checkpoints": trusted,
            "workers": workers,
            "clock_tolerance": clock_tolerance,
            "checkpoint_interval": (
                settings.checkpoint_interval if checkpoint_interval is None else checkpoint_interval
            ),
        }
        if as_json:
            report = audit(db, pinned, **options)
        else:
            with progress(
                TextColumn("auditing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()
            ) as bar:
                task = bar.add_task("leaves", total=None)
                report = audit(
                    db,
                    pinned,
                    lambda done, total: bar.update(task, completed=done, total=total),
                    **options,
                )
    if as_json:
        print_json(report.to_dict())
    else:
        _print(report)
    if not report.ok:
        raise typer.Exit(1)


def _read_checkpoint(path: Path) -> str:
    note = read_text_file(path, "checkpoint")
    if note.lstrip().startswith("{"):
        try:
            note = json.loads(note)["checkpoint"]
        except (ValueError, KeyError, TypeError):
            fail(f"{path} is JSON but not an evidence bundle with a checkpoint [bad_checkpoint]")
        if not isinstance(note, str):
            fail(f"{path}: the bundle's checkpoint is not a signed note [bad_checkpoint]")
    try:
        parse_checkpoint(note)
    except VerificationError as exc:
        fail(f"{path} holds no checkpoint: {exc.message} [{exc.code}]")
    return note


def _count(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def _print(report: AuditReport) -> None:
    rate = report.leaves / report.seconds if report.seconds else 0
    summary = (
        f"{_count(report.leaves, 'leaf', 'leaves')}, "
        f"{_count(report.checkpoints, 'checkpoint', 'checkpoints')} in {report.seconds:.2f} s "
        f"({rate:,.0f} leaves/s)"
    )
    if report.ok:
        console.print(f"[bold green]OK[/] {summary}: every check passed")
        return
    first = report.first_bad_index
    console.print(
        f"[bold red]FAILED[/] {summary}: {len(report.findings)} finding(s)"
        + ("" if first is None else f"; first bad leaf index: {first}")
    )
    out = table("check", "leaf", "table.column", "what differs", wrap=["what differs"])
    for f in report.findings[:50]:
        where = ".".join(part for part in (f.table, f.column) if part)
        out.add_row(f.check, "" if f.index is None else str(f.index), where, shown(f.message))
    console.print(out)
    if len(report.findings) > 50:
        console.print(f"... and {len(report.findings) - 50} more (--json lists them all)")
