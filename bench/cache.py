"""Cache lookup latency at scale: ``POST /v1/cache/lookup`` on a 1M-record Postgres log.

Uses the log of ``bench/log.py`` (built when missing; every other record names a seed, so half
the records are cache answers) and ``ledger serve`` on it (one process). One client over
keep-alive HTTP sends, per run:

- ``hit, hot``: a recorded deterministic request from a working set of --hot records (each
  looked up before: the server keeps its verified answer and re-reads the key's index rows),
  by fingerprint;
- ``hit, hot, by pool``: the same, naming the pool instead (a worker heartbeat registers it);
- ``hit, cold``: a recorded request never looked up before (a random one of the 500,000):
  verified against its log entry, whose pages are wherever the host has them (a host whose
  kernel reclaims idle page cache reads them from disk);
- ``hit, cold, pages in memory``: the same, after the log's entries, cache keys and their
  indexes are read into the OS page cache (``pg_prewarm``; skipped without it), as on a
  database host whose memory holds them;
- ``miss``: a deterministic request no record has (no_record);
- ``two-call``: ``POST /v1/cache/key`` then ``GET /v1/cache/{key}``, the path it replaces.

Each is reported as p50 and p99 of the server's own time (its ``Server-Timing`` header: up to
the answer's head, which carries the whole body) and client-observed, per run, then the median
of the runs. Every hit is checked to be the record asked for.

    .venv/bin/python bench/cache.py --leaves 1000000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy import select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest import machine, start_server  # noqa: E402
from bench.log import ensure_log, percentile  # noqa: E402
from ledger.heartbeat import HEARTBEAT_KIND, build_heartbeat  # noqa: E402
from ledger.signing import SigningKey, sign_envelope  # noqa: E402
from ledger.storage import tokenstore  # noqa: E402
from ledger.storage.database import Database  # noqa: E402
from ledger.storage.models import Fingerprint  # noqa: E402
from tests.support.documents import record_body  # noqa: E402

COMPLETIONS = "/v1/completions"
PREWARMED = ("log_entries", "log_entries_pkey", "cache_keys", "cache_keys_pkey")
POOL = "p1"  # the pool bench/log.py records in (a lookup by pool answers only its records)


def recorded_request(fp: str, i: int) -> dict[str, Any]:
    """The request of record ``bench-<i>`` as bench/log.py built it (even i: seeded)."""
    body = record_body(
        fp,
        request_id=f"bench-{i:08d}",
        prompt_len=16,
        out_len=16,
        seed=i,
        request_extra={"seed": i},
    )
    return dict(body["request"])


def server_ms(resp: httpx.Response) -> float:
    timing = resp.headers["server-timing"]  # app;dur=<ms>
    return float(timing.split("dur=", 1)[1])


def measure(
    label: str, send: Callable[[], list[httpx.Response]], requests: int
) -> tuple[float, float, float, float]:
    for _ in range(30):  # warm up
        send()
    server, client = [], []
    for _ in range(requests):
        t = time.perf_counter()
        responses = send()
        client.append((time.perf_counter() - t) * 1000)
        server.append(sum(server_ms(r) for r in responses))
    figures = (
        percentile(server, 50),
        percentile(server, 99),
        percentile(client, 50),
        percentile(client, 99),
    )
    print(
        f"  {label}: server p50 {figures[0]:.2f} ms, p99 {figures[1]:.2f} ms; "
        f"client p50 {figures[2]:.2f} ms, p99 {figures[3]:.2f} ms ({requests} lookups)"
    )
    return figures


def prewarm(url: str) -> bool:
    """Read the log's entries, its cache keys and their indexes into the OS page cache
    (``pg_prewarm``, a contrib extension that needs a superuser); False when it cannot."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
            for relation in PREWARMED:
                conn.execute("SELECT pg_prewarm(%s, 'read')", (relation,))
    except psycopg.Error as exc:
        print(f"  (no prewarm: {exc}; the pages-in-memory figure is skipped)")
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--leaves", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--hot", type=int, default=5000, help="records in the hot working set")
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
    token, _ = tokenstore.create_token(db, "bench-cache", ["cache:read"])
    writer, _ = tokenstore.create_token(db, "bench-cache-worker", ["records:write"])
    with db.read() as s:
        fp = s.scalars(select(Fingerprint.fingerprint_id)).one()
    db.dispose()
    collector = SigningKey.load(data_dir / "collector-key.pem")
    proc, api, _ = start_server(url, data_dir, 1)
    rng = random.Random(7)
    last = args.leaves - 1

    def beat(c: httpx.Client) -> None:
        body = build_heartbeat(
            worker_id="bench-w1", pool=POOL, url="http://127.0.0.1:9", fingerprint_id=fp
        )
        env = sign_envelope(HEARTBEAT_KIND, body, collector)
        resp = c.post(
            "/v1/workers",
            content=env.canonical,
            headers={"Authorization": f"Bearer {writer}", "Content-Type": "application/json"},
        )
        resp.raise_for_status()

    hot = [rng.randrange(4, last) // 2 * 2 for _ in range(args.hot)]  # even: seeded records

    def hit(where: dict[str, Any], pick: Callable[[], int]) -> Callable[[], list[httpx.Response]]:
        def send() -> list[httpx.Response]:
            i = pick()
            body = {"endpoint": COMPLETIONS, "request": recorded_request(fp, i), **where}
            resp = c.post("/v1/cache/lookup", json=body)
            data = resp.json()
            assert data["hit"] and data["request_id"] == f"bench-{i:08d}", data
            return [resp]

        return send

    def miss() -> list[httpx.Response]:
        request = {"prompt": f"never sent {uuid.uuid4().hex}", "max_tokens": 16, "seed": 1}
        body = {"endpoint": COMPLETIONS, "request": request, "fingerprint_id": fp}
        resp = c.post("/v1/cache/lookup", json=body)
        assert resp.json()["reason"] == "no_record", resp.text
        return [resp]

    def two_call() -> list[httpx.Response]:
        i = rng.randrange(4, last) // 2 * 2
        body = {"endpoint": COMPLETIONS, "request": recorded_request(fp, i), "fingerprint_id": fp}
        key = c.post("/v1/cache/key", json=body)
        got = c.get(f"/v1/cache/{key.json()['key']}")
        assert got.json()["request_id"] == f"bench-{i:08d}", got.text
        return [key, got]

    results: dict[str, list[tuple[float, float, float, float]]] = {}
    try:
        with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {token}"}) as c:
            prime = hit({"fingerprint_id": fp}, iter(hot).__next__)
            for _ in hot:  # every record of the working set looked up once
                prime()
            for run in range(args.runs):
                print(f"run {run + 1}:")
                beat(c)
                for label, send in (
                    ("hit, hot", hit({"fingerprint_id": fp}, lambda: rng.choice(hot))),
                    ("hit, hot, by pool", hit({"pool": POOL}, lambda: rng.choice(hot))),
                    (
                        "hit, cold",
                        hit({"fingerprint_id": fp}, lambda: rng.randrange(4, last) // 2 * 2),
                    ),
                    (
                        "hit, cold, pages in memory",
                        hit({"fingerprint_id": fp}, lambda: rng.randrange(4, last) // 2 * 2),
                    ),
                    ("miss", miss),
                    ("two-call", two_call),
                ):
                    if label == "hit, hot, by pool":
                        beat(c)  # live for the run (worker TTL 15 s)
                    if label == "hit, cold, pages in memory" and not prewarm(url):
                        continue
                    results.setdefault(label, []).append(measure(label, send, args.requests))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    print(f"median of {args.runs} runs:")
    for label, runs in results.items():
        med = [statistics.median(r[i] for r in runs) for i in range(4)]
        print(
            f"  {label}: server p50 {med[0]:.2f} ms, p99 {med[1]:.2f} ms; "
            f"client p50 {med[2]:.2f} ms, p99 {med[3]:.2f} ms"
        )


if __name__ == "__main__":
    main()
