"""The collector's differential fuzz test, run longer than `make test` runs it.

`make test` runs `tests/collectors/test_collector_semantics_fuzz.py` with 200 derandomized
examples (the same requests every run). This runs it with --examples examples, and with --seed
a different sequence each seed (hypothesis' own seed), against a fresh strict vLLM CPU server on
the tiny fixture model, and reports how many requests it tried and how long it took; a failing
request is printed by hypothesis, shrunk to the smallest it finds.

    .venv/bin/python bench/collector_fuzz.py --examples 2000 --seed 1
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/collectors/test_collector_semantics_fuzz.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2000, help="requests to generate")
    parser.add_argument("--seed", type=int, help="hypothesis seed (default: derandomized)")
    args = parser.parse_args()
    env = {**os.environ, "LEDGER_FUZZ_EXAMPLES": str(args.examples)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST]
    command += ["-k", "answers_as_vllm_alone"]
    if args.seed is not None:
        env["LEDGER_FUZZ_SEED"] = str(args.seed)
        command.append(f"--hypothesis-seed={args.seed}")
    began = time.monotonic()
    run = subprocess.run(command, cwd=ROOT, env=env, check=False)
    took = time.monotonic() - began
    outcome = "passed" if run.returncode == 0 else "FAILED"
    print(f"{args.examples} examples (seed {args.seed}): {outcome} in {took:.0f} s")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
