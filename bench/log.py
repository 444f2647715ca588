"""Log benchmarks at scale: proof and evidence latency, and audit speed.

Builds (or reuses) a Postgres database holding a log of --leaves leaves: a log key, a
collector key, a fingerprint, then signed inference records (16 prompt and 16 output tokens,
float32 logprobs; about 1 KiB each), loaded with binary COPY together with their record rows,
cache keys (as ingest derives them) and Merkle nodes, and one signed checkpoint; every other
record names a seed (a cache answer). The log key and the collector key are written beside it.
Generation is spread over two processes. A database built before any of this is rebuilt.

Then, with `ledger serve` on that database:
- p50/p99 latency of GET /v1/log/proof/inclusion (random index, current tree size) and of
  GET /v1/records/{id}/evidence (random record), measured by one client over keep-alive HTTP;
- audit speed (leaves/s): structure-only (leaf hashes, tree, checkpoints, receive times) and,
  with --full, the full audit (also every envelope's canonical form and signature, and every
  index table recomputed from the envelopes: records, cache keys, fingerprints, keys), each
  --runs times; --no-latency skips the HTTP part.

    .venv/bin/python bench/log.py --leaves 1000000 --runs 3
    .venv/bin/python bench/log.py --leaves 100000 --runs 3 --full
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import migrations  # noqa: E402
from bench.ingest import machine, start_server  # noqa: E402
from ledger import merkle  # noqa: E402
from ledger.cachekey import is_deterministic, keys_of_record  # noqa: E402
from ledger.inference_record import parse_record  # noqa: E402
from ledger.records import RECORD_KIND  # noqa: E402
from ledger.signing import SigningKey, sign_envelope  # noqa: E402
from ledger.storage import checkpoints, tokenstore, tree  # noqa: E402
from ledger.storage.audit import audit  # noqa: E402
from ledger.storage.database import Database  # noqa: E402
from tests.support.documents import record_body  # noqa: E402
from tests.support.seed import seed_ledger  # noqa: E402

CHUNK = 20_000


Generated = tuple[str, bytes, str, list[str], bool]


def _generate(args: tuple[bytes, str, int, int]) -> list[Generated]:
    pem, fp, start, count = args
    key = SigningKey.from_pem(pem)
    out = []
    for i in range(start, start + count):
        # Every other record names a seed, so it is a cache answer (bench/cache.py looks them up).
        extra = {"seed": i} if i % 2 == 0 else None
        body = record_body(
            fp, request_id=f"bench-{i:08d}", prompt_len=16, out_len=16, seed=i, request_extra=extra
        )
        env = sign_envelope(RECORD_KIND, body, key)
        keys = keys_of_record(parse_record(body), None)  # the write path's derivation
        det = is_deterministic(body["request"])
        out.append((body["request_id"], env.canonical, env.body_digest, keys, det))
    return out


def build(url: str, leaves: int, data_dir: Path) -> None:
    db = Database(url)
    migrations.upgrade(db)
    log_key = SigningKey.generate()
    log_key.write(data_dir / "log-key.pem", data_dir / "log-key.pub.pem")
    seeded = seed_ledger(db, log_key, name="bench")
    collector, fp = seeded.collector, seeded.fingerprint_id
    collector.write(data_dir / "collector-key.pem", data_dir / "collector-key.pub.pem")
    size = 3
    with db.read() as s:
        frontier = tree.node_reader(s)(merkle.append_plan(size))
    todo = leaves - size
    jobs = [(collector.private_pem(), fp, i, min(CHUNK, todo - i)) for i in range(0, todo, CHUNK)]
    now = datetime.now(UTC)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(2) as pool, psycopg.connect(url) as conn:
        for chunk in pool.map(_generate, jobs):
            hashes = [merkle.leaf_hash(c) for _, c, _, _, _ in chunk]
            nodes = merkle.append_leaves(size, hashes, frontier)
            with conn.cursor() as cur:
                with cur.copy("COPY log_entries FROM STDIN (FORMAT BINARY)") as cp:
                    cp.set_types(["int8", "varchar", "bytea", "bytea", "timestamptz"])
                    for j, (_, canonical, _, _, _) in enumerate(chunk):
                        cp.write_row((size + j, RECORD_KIND, hashes[j], canonical, now))
                with cur.copy("COPY records FROM STDIN (FORMAT BINARY)") as cp:
                    cp.set_types(
                        [
                            "varchar",
                            "int8",
                            "varchar",
                            "varchar",
                            "varchar",
                            "varchar",
                            "int2",
                            "varchar",
                            "varchar",
                            "varchar",
                            "timestamptz",
                        ]
                    )
                    for j, (rid, _, digest, _, _) in enumerate(chunk):
                        cp.write_row(
                            (
                                rid,
                                size + j,
                                digest,
                                fp,
                                collector.key_id,
                                "test-model",
                                1,
                                "p1",
                                "w1",
                                "/v1/completions",
                                now,
                            )
                        )
                with cur.copy("COPY cache_keys FROM STDIN (FORMAT BINARY)") as cp:
                    cp.set_types(["varchar", "varchar", "int8", "int2", "bool"])
                    for j, (rid, _, _, keys, det) in enumerate(chunk):
                        for k in keys:
                            cp.write_row((k, rid, size + j, 1, det))
                with cur.copy("COPY merkle_nodes FROM STDIN (FORMAT BINARY)") as cp:
                    cp.set_types(["int2", "int8", "bytea"])
                    for (level, idx), h in nodes.items():
                        cp.write_row((level, idx, h))
            conn.commit()
            known = {**frontier, **nodes}
            size += len(chunk)
            frontier = {n: known[n] for n in merkle.append_plan(size)}
            print(f"  built {size:,} leaves ({time.perf_counter() - t0:.0f} s)", flush=True)
    checkpoints.sign_if_new(db, log_key, checkpoints.default_origin(log_key))
    db.dispose()
    with psycopg.connect(url, autocommit=True) as conn:
        # Planner statistics, hint bits and the visibility map, as autovacuum keeps them on a
        # live ledger (else the first read of each page after the bulk load writes it too).
        conn.execute("VACUUM (ANALYZE)")


def _has_cache_keys(url: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT EXISTS (SELECT 1 FROM cache_keys)").fetchone()[0]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def latency(url: str, data_dir: Path, token: str, requests: int) -> None:
    """p50/p99 of inclusion proofs and evidence bundles, one client, keep-alive HTTP."""
    proc, api, _ = start_server(url, data_dir, 1)
    try:
        rng = random.Random(1)
        with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {token}"}) as c:
            size = c.get("/v1/log/checkpoint").json()["tree_size"]
            for label, make in (
                (
                    "inclusion proof",
                    lambda: (
                        "/v1/log/proof/inclusion",
                        {"index": rng.randrange(size), "tree_size": size},
                    ),
                ),
                (
                    "evidence bundle",
                    lambda: (f"/v1/records/bench-{rng.randrange(size - 3):08d}/evidence", None),
                ),
            ):
                for _ in range(20):  # warm up
                    path, params = make()
                    c.get(path, params=params).raise_for_status()
                times = []
                for _ in range(requests):
                    path, params = make()
                    t = time.perf_counter()
                    c.get(path, params=params).raise_for_status()
                    times.append((time.perf_counter() - t) * 1000)
                print(
                    f"{label}: p50 {percentile(times, 50):.2f} ms, "
                    f"p99 {percentile(times, 99):.2f} ms ({requests} requests)"
                )
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def ensure_log(pg: str, leaves: int) -> tuple[str, Path, str]:
    """The database of a ``leaves``-leaf log (built unless a complete one exists), its data
    directory (the log key) and the server's version."""
    name = f"ledger_bench_log_{leaves}"
    url = pg.rpartition("/")[0] + "/" + name
    data_dir = Path(tempfile.gettempdir()) / name
    with psycopg.connect(pg, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        pg_version = conn.execute("SHOW server_version").fetchone()[0]
    if exists and not _has_cache_keys(url):
        exists = None  # built before cache keys were loaded: the full audit would fail it
    if not (data_dir / "collector-key.pem").exists():
        exists = None  # built before half its records were deterministic (bench/cache.py)
    if not exists or not (data_dir / "log-key.pem").exists():
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        data_dir.mkdir(parents=True, exist_ok=True)
        for f in data_dir.iterdir():
            f.unlink()
        print(f"building a {leaves:,}-leaf log in {name} ...")
        build(url, leaves, data_dir)
    return url, data_dir, str(pg_version)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--leaves", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--full", action="store_true", help="also time the full audit")
    ap.add_argument("--workers", type=int, default=1, help="processes for the full audit")
    ap.add_argument("--no-latency", action="store_true", help="skip the proof/evidence latency")
    ap.add_argument(
        "--pg",
        default=os.environ.get(
            "LEDGER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = ap.parse_args()
    url, data_dir, pg_version = ensure_log(args.pg, args.leaves)
    print(f"machine: {machine()}; PostgreSQL {pg_version}; log of {args.leaves:,} leaves")

    db = Database(url)
    token, _ = tokenstore.create_token(db, "bench", ["records:read"])
    log_key = SigningKey.load(data_dir / "log-key.pem")
    if not args.no_latency:
        latency(url, data_dir, token, args.requests)
    modes = [("structure-only", False)] + (
        [(f"full, {args.workers} worker(s)", True)] if args.full else []
    )
    for label, full in modes:
        rates = []
        for run in range(args.runs):
            report = audit(db, log_key.public_key, signatures=full, workers=args.workers)
            assert report.ok, report.findings[:3]
            rates.append(report.leaves / report.seconds)
            print(
                f"audit ({label}) run {run + 1}: {rates[-1]:,.0f} leaves/s ({report.seconds:.1f} s)"
            )
        print(f"audit ({label}) median: {statistics.median(rates):,.0f} leaves/s")


if __name__ == "__main__":
    main()
