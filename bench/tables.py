"""Time to render a CLI table (``cli/tables.py``) of --rows rows, piped and on a terminal.

The rows are shaped like ``ledger records search``'s, with a prose column: an RFC 3339 time, a
64-hex request ID, short words (model, pool, tier, verdict) and a note of a few to a dozen
words (the ``wrap`` column). Each run renders the whole table into a string: ``piped`` is a
console that is not a terminal (the table at its natural width), ``terminal`` one forced to be
a terminal --width columns wide (the note wraps). Prints the median of --runs runs. With
--tables FILE another version of the module (``git show <commit>:cli/tables.py > FILE``) is
timed instead of this tree's.

    .venv/bin/python bench/tables.py --rows 5000 --runs 3
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import random
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEADERS = ("received", "request ID", "model", "pool", "tier", "verdict", "note")
WORDS = ("the", "replay", "matched", "every", "token", "but", "logprobs", "differ", "after", "a")


def module(path: Path | None) -> ModuleType:
    if path is None:
        import cli.tables

        return cli.tables
    spec = importlib.util.spec_from_file_location("tables_under_test", path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def rows(n: int, seed: int = 7) -> list[tuple[str, ...]]:
    rng = random.Random(seed)
    return [
        (
            f"2026-12-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:{(7 * i) % 60:02d}Z",
            f"{rng.getrandbits(256):064x}",
            rng.choice(("llama-3.1-8b", "qwen2.5-7b", "mistral-7b")),
            rng.choice(("default", "eu-west", "batch")),
            rng.choice(("bitwise", "numeric", "greedy")),
            rng.choice(("match", "mismatch", "-")),
            " ".join(rng.choices(WORDS, k=rng.randint(3, 12))),
        )
        for i in range(n)
    ]


def render(tables: ModuleType, data: list[tuple[str, ...]], terminal: bool, width: int) -> str:
    out = tables.table(*HEADERS, wrap=["note"])
    for row in data:
        out.add_row(*row)
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=width, force_terminal=terminal, soft_wrap=True, emoji=False
    )
    console.print(out)
    return buffer.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--width", type=int, default=160, help="the terminal's columns")
    ap.add_argument("--tables", type=Path, help="another version of cli/tables.py to time")
    args = ap.parse_args()
    tables = module(args.tables)
    data = rows(args.rows)
    for label, terminal in (("piped", False), ("terminal", True)):
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            render(tables, data, terminal, args.width)
            times.append(time.perf_counter() - started)
        print(f"{label:9s} rows={args.rows}  median {statistics.median(times):.3f} s")


if __name__ == "__main__":
    main()
