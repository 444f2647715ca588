"""``ledger fixture-model``: build the seeded Llama-family model tests and the demo serve."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import typer

from cli.common import console, fail, print_json


def fixture_model(
    directory: Path = typer.Argument(..., help="where to write the model (created or replaced)"),
    size: Literal["small", "tiny"] = typer.Option(
        "small", "--size", help="small (about 92 MB) or tiny (under 1 MB)"
    ),
    seed: int = typer.Option(0, "--seed", help="weight seed; same seed, same bytes"),
    as_json: bool = typer.Option(False, "--json", help="print JSON for scripts"),
) -> None:
    """Build a Llama-family model (bfloat16, byte-level BPE, chat template) that vLLM loads."""
    from fixture_model import build

    if seed < 0:
        fail("--seed must be 0 or more")
    started = time.perf_counter()
    try:
        target = build(directory, size=size, seed=seed)
    except (OSError, ValueError) as exc:
        fail(f"cannot build the fixture model in {directory}: {exc}")
    files = sorted(p for p in target.iterdir() if p.is_file())
    total = sum(p.stat().st_size for p in files)
    if as_json:
        print_json({"path": str(target), "size": size, "seed": seed, "bytes": total})
        return
    console.print(
        f"built the {size} fixture model (seed {seed}) in {target}: {len(files)} files, "
        f"{total / 1e6:.1f} MB, {time.perf_counter() - started:.1f} s"
    )
