"""The audit of one log by two versions of the code, run by turns: is there a regression?

Builds (or reuses) the Postgres log of --leaves leaves that `bench/log.py` builds (same
database, same key), then runs `ledger.storage.audit.audit` over it from this tree and from
--against (a git worktree of another commit, e.g. `git worktree add /tmp/before 9caf778`),
alternating the two --rounds times, each run in a fresh interpreter with that tree first on
its path. Reports every run and the medians, for the structure-only audit and (with --full)
the full audit with --workers processes. Alternating turns share whatever else loads the host
between the two versions.

    .venv/bin/python bench/audit_compare.py --leaves 100000 --against /tmp/before --full
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest import machine  # noqa: E402
from bench.log import _has_cache_keys  # noqa: E402

RUN = """
import sys
from pathlib import Path
from ledger.signing import SigningKey
from ledger.storage.audit import audit
from ledger.storage.database import Database
url, key, full, workers = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
key = SigningKey.load(Path(key)).public_key
report = audit(Database(url), key, signatures=full, workers=workers)
assert report.ok, report.findings[:3]
print(f"RESULT {report.leaves} {report.seconds}")
"""


def run_once(tree: Path, url: str, key: Path, full: bool, workers: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", RUN, url, str(key), "1" if full else "0", str(workers)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    leaves, seconds = line.split()[1:]
    return int(leaves) / float(seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leaves", type=int, default=100_000)
    ap.add_argument("--against", type=Path, required=True, help="the other tree (a worktree)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="also compare the full audit")
    ap.add_argument("--workers", type=int, default=2, help="processes for the full audit")
    ap.add_argument(
        "--pg",
        default=os.environ.get(
            "LEDGER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = ap.parse_args()
    name = f"ledger_bench_log_{args.leaves}"
    url = args.pg.rpartition("/")[0] + "/" + name
    data_dir = Path(tempfile.gettempdir()) / name
    key = data_dir / "log-key.pem"
    with psycopg.connect(args.pg, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    if not exists or not key.exists() or not _has_cache_keys(url):
        sys.exit(f"build the log first: .venv/bin/python bench/log.py --leaves {args.leaves} ...")
    trees = {"other": args.against.resolve(), "this": ROOT}
    print(f"machine: {machine()}; log of {args.leaves:,} leaves; other tree: {trees['other']}")
    modes = [("structure-only", False, 1)]
    if args.full:
        modes.append((f"full, {args.workers} workers", True, args.workers))
    for label, full, workers in modes:
        rates: dict[str, list[float]] = {name: [] for name in trees}
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                rates[name].append(run_once(tree, url, key, full, workers))
                print(
                    f"audit ({label}) round {round_ + 1}, {name}: {rates[name][-1]:,.0f} leaves/s"
                )
        medians = {name: statistics.median(r) for name, r in rates.items()}
        print(
            f"audit ({label}) medians: other {medians['other']:,.0f}, this {medians['this']:,.0f}"
            f" leaves/s (this/other {medians['this'] / medians['other']:.3f})"
        )


if __name__ == "__main__":
    main()
