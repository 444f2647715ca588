"""The memory a process's kept cache answers take, against the budget they are given.

Builds an embedded (SQLite) ledger of --records deterministic records of one shape (--prompt
and --output tokens, --top-k logprobs per output token, schema v2), then looks each up once
per pass (``ledger.storage.cache_lookup.answer``, as ``POST /v1/cache/lookup`` does), for
--passes passes, each answer served. After every pass it reports the kept answers, what they
are charged, and the process's resident memory (RSS, from /proc). One run per budget, each in
a fresh process, for every --budget-mib given: the last pass's RSS, the first's and the RSS
before any lookup say whether the kept answers level off at their budget.

    .venv/bin/python bench/cache_memory.py --records 3000 --budget-mib 16 --budget-mib 128
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest import machine  # noqa: E402

MIB = 1024 * 1024


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * 4096 / MIB


def one_run(args: argparse.Namespace, budget_mib: float) -> dict[str, Any]:
    import migrations
    from ledger.cachekey import COMPLETIONS
    from ledger.storage import ingest
    from ledger.storage.cache_lookup import HotAnswers, answer
    from ledger.storage.database import Database
    from tests.support.documents import record_body, record_item_v2
    from tests.support.seed import seed_ledger

    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{tmp}/ledger.db")
        migrations.upgrade(db)
        seeded = seed_ledger(db)
        shape = {
            "prompt_len": args.prompt,
            "out_len": args.output,
            "top_k": args.top_k,
            "tier": 1,
            "request_extra": {"temperature": 0},
        }
        requests = []
        t = time.perf_counter()
        for start in range(0, args.records, 200):
            items = []
            for seed in range(start, min(start + 200, args.records)):
                items.append(
                    record_item_v2(seeded.collector, seeded.fingerprint_id, seed=seed, **shape)
                )
                requests.append(record_body(seeded.fingerprint_id, seed=seed, **shape)["request"])
            ingest.ingest_records(db, items)
        built = time.perf_counter() - t
        hot = HotAnswers(int(budget_mib * MIB))
        gc.collect()
        passes = [{"pass": 0, "kept": 0, "charged_mib": 0.0, "rss_mib": rss_mib()}]
        for n in range(1, args.passes + 1):
            for request in requests:
                found = answer(db, COMPLETIONS, request, seeded.fingerprint_id, hot=hot)
                assert found.hit and found.response is not None
            gc.collect()
            passes.append(
                {"pass": n, "kept": len(hot), "charged_mib": hot.bytes / MIB, "rss_mib": rss_mib()}
            )
        db.dispose()
    return {"budget_mib": budget_mib, "build_s": built, "passes": passes}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens per record")
    ap.add_argument("--output", type=int, default=512, help="output tokens per record")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--budget-mib", type=float, action="append", help="repeatable (default 128)")
    ap.add_argument("--one", type=float, help=argparse.SUPPRESS)  # a child process's run
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one_run(args, args.one)))
        return
    print(f"machine: {machine()}")
    print(
        f"{args.records:,} records of {args.prompt} prompt and {args.output} output tokens, "
        f"top-{args.top_k}; {args.passes} passes, every record looked up once per pass"
    )
    for budget in args.budget_mib or [128.0]:
        child = [sys.executable, __file__, "--one", str(budget)]
        for flag in ("records", "prompt", "output", "top_k", "passes"):
            child += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        out = subprocess.run(child, check=True, capture_output=True, text=True, cwd=ROOT)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"budget {budget:g} MiB (ledger built in {result['build_s']:.0f} s):")
        for p in result["passes"]:
            print(
                f"  after pass {p['pass']}: {p['kept']:,} kept, charged "
                f"{p['charged_mib']:.1f} MiB, RSS {p['rss_mib']:.0f} MiB"
            )


if __name__ == "__main__":
    main()
