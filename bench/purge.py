"""Retention purge benchmark: records whose content is erased per second, at 100k records.

Each run builds a fresh Postgres ledger holding N schema v2 records (small ones: 16 prompt and
16 output tokens; the purge's cost is per record, not per byte), then times the retention
purge that erases the content of all of them (`ledger.storage.erasures.purge_expired`, as the
server runs it: 500 records per transaction, one signed erasure event each, their
disclosures and cache keys deleted). Reports records/s per run and the median; checks after
each run that every record's content is gone and that nothing is left to erase.

    .venv/bin/python bench/purge.py --records 100000 --runs 3

``--v1-log N`` times instead what each hourly purge costs on a ledger of N schema v1 records
(never erasable: their content is in their leaves), the Postgres log of ``bench/log.py``: the
purge's scan, as a dry run with every record past the retention, and, for comparison, the
scan of a bulk erasure by filter, which reads every record to count the v1 ones.

    .venv/bin/python bench/purge.py --v1-log 1000000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import migrations  # noqa: E402
from bench.ingest import machine  # noqa: E402
from bench.log import ensure_log  # noqa: E402
from ledger.signing import SigningKey  # noqa: E402
from ledger.storage import erasures, ingest  # noqa: E402
from ledger.storage.database import Database, utcnow  # noqa: E402
from ledger.storage.queries import RecordFilter  # noqa: E402
from tests.support.documents import record_item_v2  # noqa: E402
from tests.support.seed import seed_ledger  # noqa: E402


def one_run(admin_url: str, records: int) -> float:
    name = f"ledger_purge_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    db = Database(admin_url.rpartition("/")[0] + "/" + name)
    try:
        migrations.upgrade(db)
        seeded = seed_ledger(db)
        for start in range(0, records, 1000):
            ingest.ingest_records(
                db,
                [
                    record_item_v2(
                        seeded.collector, seeded.fingerprint_id, prompt_len=16, out_len=16
                    )
                    for _ in range(min(1000, records - start))
                ],
            )
        later = utcnow() + timedelta(days=31)
        started = time.perf_counter()
        result = erasures.purge_expired(db, seeded.log_key, 30, now=later)
        elapsed = time.perf_counter() - started
        if len(result.erased) != records:
            raise SystemExit(f"erased {len(result.erased)} of {records}")
        again = erasures.purge_expired(db, seeded.log_key, 30, now=later)
        with db.engine.connect() as conn:
            left = conn.exec_driver_sql("SELECT count(*) FROM disclosures").scalar_one()
        if again.erased or left:
            raise SystemExit(f"content left after the purge: {left} rows")
        return records / elapsed
    finally:
        db.dispose()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def v1_scan(admin_url: str, leaves: int, runs: int) -> None:
    url, _, _ = ensure_log(admin_url, leaves)
    db = Database(url)
    key = SigningKey.generate()  # a dry run signs nothing
    print(f"machine: {machine()}; log of {leaves:,} leaves (schema v1 records)")
    for label, with_content in (("the retention purge", True), ("a bulk erasure", False)):
        times = []
        for run in range(runs if with_content else 1):
            start = time.perf_counter()
            result = erasures.erase_matching(
                db,
                key,
                RecordFilter(),
                reason="bench",
                requested_by="retention",
                reason_code="retention",
                dry_run=True,
                before=utcnow() + timedelta(days=1),
                with_content=with_content,
            )
            times.append(time.perf_counter() - start)
            print(
                f"{label}, run {run + 1}: {times[-1]:.2f} s (would erase "
                f"{len(result.erased)}; v1 records read: {result.not_erasable:,})"
            )
        print(f"{label}: median {statistics.median(times):.2f} s")
    db.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--pg",
        default=os.environ.get(
            "LEDGER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    ap.add_argument("--v1-log", type=int, help="time the purge's scan of this many v1 records")
    args = ap.parse_args()
    if args.v1_log:
        v1_scan(args.pg, args.v1_log, args.runs)
        return
    print(f"machine: {machine()}; {args.records} v2 records per run")
    rates = []
    for run in range(args.runs):
        rates.append(one_run(args.pg, args.records))
        print(f"run {run + 1}: {rates[-1]:,.0f} records erased/s")
    print(f"median: {statistics.median(rates):,.0f} records erased/s")


if __name__ == "__main__":
    main()
