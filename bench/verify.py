"""Offline verification benchmark: evidence bundles verified per second on one core.

Builds a ledger on SQLite in a temporary directory, ingests N schema v2 records of the ingest
benchmark's shape (512 prompt tokens, 256 output tokens, top-5 logprobs; `--schema 1` for v1),
exports one full evidence bundle per record (every disclosure carried and checked) into a
directory, one JSON file each (all under one checkpoint, as an
auditor fetching a day's evidence would), and writes the log's public key beside them.

Then a fresh interpreter, pinned to one core, does what a verifier does: it reads the files'
bytes (not timed) and times `verify_bundle(orjson.loads(data), pinned_log_key)` for all of
them, single-threaded: what a program verifying many bundles with the library does. It also
times `verify_bundle(load_bundle(data), pinned_log_key)`, what `ledger verify` does with a
file's bytes: `load_bundle` also refuses a member named twice, with Python's JSON reader, which
is slower than orjson. A fresh process, because the ledger that built the bundles leaves ~10^5
live objects whose garbage-collector passes a verifier never pays. Repeats --runs times, the
two readers by turns; prints the medians.

    .venv/bin/python bench/verify.py --bundles 2000 --runs 3
    .venv/bin/python bench/verify.py --verify-dir DIR --runs 3   # verify an existing export
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import migrations  # noqa: E402
from bench.ingest import machine  # noqa: E402
from ledger.evidence import verify_bundle  # noqa: E402
from ledger.evidence_format import load_bundle  # noqa: E402
from ledger.signing import load_public_key, public_key_pem  # noqa: E402
from ledger.storage import checkpoints, ingest, proofs  # noqa: E402
from ledger.storage.database import Database  # noqa: E402
from tests.support.documents import record_envelope, record_item_v2  # noqa: E402
from tests.support.seed import seed_ledger  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bundles", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--verify-dir", type=Path, help="time the verification of DIR/*.json only")
    ap.add_argument("--schema", type=int, choices=(1, 2), default=2, help="record schema")
    args = ap.parse_args()
    if args.verify_dir is not None:
        time_verification(args.verify_dir, args.runs)
        return
    out = Path(tempfile.mkdtemp(prefix="ledger-verify-bench-"))
    export(out, args.bundles, args.schema)
    print(f"machine: {machine()}")
    subprocess.run(
        [sys.executable, __file__, "--verify-dir", str(out), "--runs", str(args.runs)], check=True
    )


def export(out: Path, count: int, schema: int = 2) -> None:
    """Ledger on SQLite under out/, one bundle per record in out/*.json, the log key in out/."""
    db = Database(f"sqlite:///{out / 'ledger.db'}")
    migrations.upgrade(db)
    seeded = seed_ledger(db)
    log_key, collector, fp = seeded.log_key, seeded.collector, seeded.fingerprint_id
    ids = []
    for start in range(0, count, 500):
        shape = {"prompt_len": 512, "out_len": 256, "top_k": 5, "text_prompt": True}
        n = min(500, count - start)
        batch: list[Any] = (
            [record_item_v2(collector, fp, **shape) for _ in range(n)]
            if schema == 2
            else [record_envelope(collector, fp, **shape).to_dict() for _ in range(n)]
        )
        ids += [r.request_id for r in ingest.ingest_records(db, batch)]
    checkpoints.sign_if_new(db, log_key, "bench/log")
    for i, rid in enumerate(ids):
        bundle = proofs.evidence(db, log_key, "bench/log", rid)
        (out / f"bundle-{i:06d}.json").write_text(json.dumps(bundle, indent=2))
    (out / "log-key.pem").write_text(public_key_pem(log_key.public_key))


def time_verification(directory: Path, runs: int) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    pinned = load_public_key((directory / "log-key.pem").read_bytes())
    texts = [path.read_bytes() for path in sorted(directory.glob("*.json"))]
    size = sum(map(len, texts)) / len(texts) / 1024
    print(f"{len(texts)} bundles of {size:.1f} KiB, verified in a fresh process on one core")
    readers = {"orjson.loads": orjson.loads, "load_bundle (ledger verify)": load_bundle}
    rates: dict[str, list[float]] = {name: [] for name in readers}
    for run in range(runs):
        for name, read in readers.items():
            start = time.perf_counter()
            for text in texts:
                verify_bundle(read(text), pinned)
            rates[name].append(len(texts) / (time.perf_counter() - start))
            print(f"run {run + 1}, {name}: {rates[name][-1]:,.0f} bundles/s")
    print(f"median: {statistics.median(rates['orjson.loads']):,.0f} bundles/s on one core")
    print(
        f"median, read as ledger verify reads a file: "
        f"{statistics.median(rates['load_bundle (ledger verify)']):,.0f} bundles/s on one core"
    )


if __name__ == "__main__":
    main()
