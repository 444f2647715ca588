"""Offline verification benchmark: evidence bundles verified per second on one core.

Builds a ledger on SQLite in a temporary directory, ingests N records of the ingest
benchmark's shape (512 prompt tokens, 256 output tokens, top-5 logprobs), exports one evidence
bundle per record (all under one checkpoint, as an auditor fetching a day's evidence would),
serializes them to JSON bytes, then times `verify_bundle(orjson.loads(data), pinned_log_key)`
(what `ledger verify` does with a file's bytes) for all of them, single-threaded. Repeats
--runs times; prints the median.

    .venv/bin/python bench/verify.py --bundles 2000 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import migrations  # noqa: E402
from bench.ingest import machine  # noqa: E402
from ledger.evidence import verify_bundle  # noqa: E402
from ledger.storage import checkpoints, ingest, proofs  # noqa: E402
from ledger.storage.database import Database  # noqa: E402
from tests.support.documents import record_envelope  # noqa: E402
from tests.support.seed import seed_ledger  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bundles", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    tmp = Path(tempfile.mkdtemp(prefix="ledger-verify-bench-"))
    db = Database(f"sqlite:///{tmp / 'l.db'}")
    migrations.upgrade(db)
    seeded = seed_ledger(db)
    log_key, collector, fp = seeded.log_key, seeded.collector, seeded.fingerprint_id
    ids = []
    for start in range(0, args.bundles, 500):
        batch = [
            record_envelope(collector, fp, prompt_len=512, out_len=256, top_k=5, text_prompt=True)
            for _ in range(min(500, args.bundles - start))
        ]
        ids += [r.request_id for r in ingest.ingest_records(db, [e.to_dict() for e in batch])]
    checkpoints.sign_if_new(db, log_key, "bench/log")
    texts = [json.dumps(proofs.evidence(db, log_key, "bench/log", rid)).encode() for rid in ids]
    size = sum(map(len, texts)) / len(texts) / 1024
    print(f"machine: {machine()}; pinned to one core")
    print(f"{len(texts)} bundles of {size:.1f} KiB (tree size {len(ids) + 3})")
    rates = []
    for run in range(args.runs):
        start = time.perf_counter()
        for text in texts:
            verify_bundle(orjson.loads(text), log_key.public_key)
        rates.append(len(texts) / (time.perf_counter() - start))
        print(f"run {run + 1}: {rates[-1]:,.0f} bundles/s")
    print(f"median: {statistics.median(rates):,.0f} bundles/s on one core")


if __name__ == "__main__":
    main()
