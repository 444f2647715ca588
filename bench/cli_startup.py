"""Whole-process wall time of `ledger --help` and `ledger verify` (a bundle from
docs/examples): what a person typing a command waits for, imports included.

Each command runs --runs times in a fresh interpreter (`python -m cli ...`, as the console
script does); medians are printed. With --against DIR (a git worktree of another commit) the
two trees alternate, run by run, so both share whatever else loads the host.

    .venv/bin/python bench/cli_startup.py --runs 10 --against /tmp/before
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
COMMANDS = {
    "ledger --help": ["--help"],
    "ledger verify": [
        "verify",
        str(EXAMPLES / "evidence-example.json"),
        "--log-key",
        str(EXAMPLES / "log-key.pub.pem"),
    ],
}


def once(tree: Path, args: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "120"}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "cli", *args], cwd=tree, env=env, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(
            f"{tree}: ledger {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
        )
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--against", type=Path, help="another tree, alternated with this one")
    args = ap.parse_args()
    trees = {"this": ROOT, **({"other": args.against.resolve()} if args.against else {})}
    for label, argv in COMMANDS.items():
        times: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(args.runs):
            for name, tree in trees.items():
                times[name].append(once(tree, argv))
        shown = ", ".join(
            f"{name} {statistics.median(ts) * 1000:.0f} ms (min {min(ts) * 1000:.0f})"
            for name, ts in times.items()
        )
        print(f"{label}: median of {args.runs}: {shown}", flush=True)


if __name__ == "__main__":
    main()
