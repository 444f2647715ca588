"""Ingest benchmark: signed records/s through the API on Postgres, against raw COPY.

Starts `ledger serve` on a scratch Postgres database, registers a collector key and a
fingerprint, pre-signs N records (512 prompt tokens, 256 output tokens, top-5 logprobs) of
each schema asked for, then posts them in batches and reports records/s: schema v2 (the body
commits to salted disclosures, which travel beside it and are stored apart; what collectors
write) and schema v1 (content in the signed body), by turns in each run, and their ratio. In
the same run it loads the v1 rows (log entry + index columns) with psycopg COPY into a scratch
table and prints the ratio. Repeats --runs times and reports the medians.

    .venv/bin/python bench/ingest.py --records 10000 --batch 500 --runs 3

Fleet mode (``--fleet``): many collectors at moderate rates each ship a few records at a time.
--clients concurrent clients (default 64) post schema v2 batches of 1-8 records (sizes drawn
at random, the same sequence each run) until --records are in; reports records/s and batches/s
(no v1 or COPY comparison).

    .venv/bin/python bench/ingest.py --fleet --records 10000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo.server_thread import free_port  # noqa: E402
from ledger.merkle import leaf_hash  # noqa: E402
from ledger.record_v2 import wire_item  # noqa: E402
from ledger.signing import Envelope, SigningKey, public_key_pem  # noqa: E402
from tests.support.documents import (  # noqa: E402
    fingerprint_envelope,
    record_envelope,
    record_v2,
)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}"


def start_server(
    db_url: str, data_dir: Path, workers: int
) -> tuple[subprocess.Popen[bytes], str, str]:
    port = free_port()
    env = {
        **os.environ,
        "LEDGER_DATABASE_URL": db_url,
        "LEDGER_DATA_DIR": str(data_dir),
        "LEDGER_PORT": str(port),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--log-level", "warning", "--workers", str(workers)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                token_file = data_dir / "admin.token"
                token = token_file.read_text().strip() if token_file.exists() else ""
                return proc, url, token
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("ledger serve did not start")


def worker_cpu(server_pid: int) -> dict[int, float]:
    """CPU seconds used so far by each API worker process (the server's children)."""
    out: dict[int, float] = {}
    try:
        children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
        for child in map(int, children):
            fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            out[child] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):  # not Linux, or a worker exited: the split is not shown
        return {}
    return out


def post_all(url: str, token: str, bodies: list[bytes], concurrency: int) -> float:
    queue = list(reversed(bodies))
    lock = threading.Lock()
    failures: list[str] = []

    def worker() -> None:
        with httpx.Client(
            base_url=url,
            timeout=120,
            headers={"Authorization": f"Bearer {token}", "content-type": "application/json"},
        ) as c:
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                r = c.post("/v1/records", content=body)
                if r.status_code != 201:
                    failures.append(r.text[:300])
                    return

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"ingest failed: {failures[0]}")
    return time.perf_counter() - start


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` and its live children."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    try:
        pids += map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
        for p in pids:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    except (OSError, ValueError):
        return float("nan")
    return total


def postgres_cpu() -> float:
    """CPU seconds used so far by every process named postgres (the server and backends)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, _, rest = text.partition(" (")[2].rpartition(")")
        if name.startswith("postgres"):
            fields = rest.split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def _post(reader: Any, writer: Any, head: bytes, body: bytes) -> tuple[int, float, bytes]:
    """One HTTP/1.1 POST on a kept-alive connection: (status, Retry-After, body)."""
    writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    length, retry = 0, 1.0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"retry-after":
            retry = float(value)
    return status, retry, await reader.readexactly(length)


def post_fleet(url: str, token: str, bodies: list[bytes], clients: int) -> float:
    """Post ``bodies`` from ``clients`` concurrent keep-alive connections.

    A bare asyncio HTTP/1.1 client (requests with Content-Length, answers with
    Content-Length, as the API sends them): the load generator shares the 2 cores with the
    server and Postgres, and httpx's per-request cost would be charged to the ledger."""
    import asyncio
    from urllib.parse import urlsplit

    where = urlsplit(url)
    head = (
        f"POST /v1/records HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        "Content-Length: "
    ).encode()

    async def run() -> float:
        queue = list(reversed(bodies))
        failures: list[str] = []

        async def client() -> None:
            reader, writer = await asyncio.open_connection(where.hostname, where.port)
            try:
                while queue and not failures:
                    body = queue.pop()
                    status, retry, answer = await _post(reader, writer, head, body)
                    if status == 503:  # busy: back off as a collector's shipper does
                        queue.append(body)
                        await asyncio.sleep(retry / 10)
                    elif status != 201:
                        failures.append(f"{status} {answer[:300]!r}")
            finally:
                writer.close()

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - start
        if failures:
            raise SystemExit(f"ingest failed: {failures[0]}")
        return elapsed

    return asyncio.run(run())


def group_sizes(url: str) -> tuple[float, float]:
    """(batches, transactions) appended so far, from ``ledger_ingest_group_batches``."""
    found = {"sum": 0.0, "count": 0.0}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        for part in found:
            if line.startswith(f"ledger_ingest_group_batches_{part}"):
                found[part] += float(line.split()[-1])
    return found["sum"], found["count"]


def fleet(
    url: str, token: str, key: SigningKey, fp_id: str, args: argparse.Namespace, server_pid: int
) -> None:
    import random

    rng = random.Random(7)
    sizes: list[int] = []
    while sum(sizes) < args.records:
        sizes.append(rng.randint(1, 8))
    print(
        f"fleet: {args.records} records/run in {len(sizes)} batches of 1-8, "
        f"{args.clients} clients, {args.workers} API worker(s)"
    )
    rates = []
    for run in range(args.runs):
        items = [
            wire_item(env.canonical, disclosures)
            for env, disclosures in (
                record_v2(key, fp_id, prompt_len=512, out_len=256, top_k=5, text_prompt=True)
                for _ in range(sum(sizes))
            )
        ]
        bodies, at = [], 0
        for n in sizes:
            bodies.append(b'{"records":[' + b",".join(items[at : at + n]) + b"]}")
            at += n
        groups_before = group_sizes(url)
        before = (process_cpu(server_pid), time.process_time(), postgres_cpu())
        seconds = post_fleet(url, token, bodies, args.clients)
        after = (process_cpu(server_pid), time.process_time(), postgres_cpu())
        ms = [(b - a) * 1000 / len(bodies) for a, b in zip(before, after, strict=True)]
        summed, count = (b - a for a, b in zip(groups_before, group_sizes(url), strict=True))
        rates.append(len(items) / seconds)
        print(
            f"run {run + 1}: {rates[-1]:,.0f} records/s, {len(bodies) / seconds:,.0f} batches/s; "
            f"CPU per batch: ledger {ms[0]:.2f} ms, Postgres {ms[2]:.2f} ms, "
            f"load generator {ms[1]:.2f} ms; {summed / max(count, 1):.1f} batches per "
            "transaction (as sampled by one API worker's /metrics)",
            flush=True,
        )
    print(f"median: {statistics.median(rates):,.0f} records/s (fleet, {args.clients} clients)")


COPY_TYPES = [
    "int8",
    "text",
    "bytea",
    "bytea",
    "text",
    "text",
    "text",
    "text",
    "text",
    "int2",
    "text",
    "text",
    "text",
]


def copy_rows(db_url: str, envs: list[Envelope], table: str) -> float:
    rows = []
    for i, e in enumerate(envs):
        b = e.body
        rows.append(
            (
                i,
                e.kind,
                leaf_hash(e.canonical),
                e.canonical,
                b["request_id"],
                e.body_digest,
                b["fingerprint_id"],
                e.key_id,
                b["model"],
                b["tier"],
                b["pool"],
                b["worker_id"],
                b["endpoint"],
            )
        )
    with psycopg.connect(db_url) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (idx bigint primary key, kind text, leaf_hash bytea,"
                " envelope bytea,"
                " request_id text unique, content_hash text, fingerprint_id text, key_id text,"
                " model text, tier smallint, pool text, worker_id text, endpoint text,"
                " received_at timestamptz default now())"
            ).format(sql.Identifier(table))
        )
        # The same storage as the ledger's log_entries.envelope (migration 0005).
        conn.execute(
            sql.SQL("ALTER TABLE {} ALTER COLUMN envelope SET STORAGE EXTERNAL").format(
                sql.Identifier(table)
            )
        )
        conn.commit()
        start = time.perf_counter()
        with (
            conn.cursor() as cur,
            cur.copy(
                sql.SQL(
                    "COPY {} (idx, kind, leaf_hash, envelope, request_id, content_hash,"
                    " fingerprint_id,"
                    " key_id, model, tier, pool, worker_id, endpoint) FROM STDIN (FORMAT BINARY)"
                ).format(sql.Identifier(table))
            ) as cp,
        ):
            cp.set_types(COPY_TYPES)
            for row in rows:
                cp.write_row(row)
        conn.commit()
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="API worker processes")
    ap.add_argument("--fleet", action="store_true", help="many clients, batches of 1-8")
    ap.add_argument("--clients", type=int, default=64, help="fleet mode: concurrent clients")
    ap.add_argument(
        "--prompt",
        choices=["text", "ids"],
        default="text",
        help="request prompt as text (typical) or as a token-ID list",
    )
    ap.add_argument(
        "--pg",
        default=os.environ.get(
            "LEDGER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = ap.parse_args()

    name = f"ledger_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.pg, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        pg_version = conn.execute("SHOW server_version").fetchone()[0]
    db_url = args.pg.rpartition("/")[0] + "/" + name
    tmp = Path(tempfile.mkdtemp(prefix="ledger-bench-"))
    proc, url, token = start_server(db_url, tmp, args.workers)
    try:
        key = SigningKey.generate()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
            c.post(
                "/v1/keys",
                json={
                    "name": "bench",
                    "role": "collector",
                    "public_key": public_key_pem(key.public_key),
                },
            ).raise_for_status()
            fp = c.post("/v1/fingerprints", content=fingerprint_envelope(key).canonical)
            fp.raise_for_status()
            fp_id = fp.json()["fingerprint_id"]
        print(f"machine: {machine()}; PostgreSQL {pg_version}")
        if args.fleet:
            fleet(url, token, key, fp_id, args, proc.pid)
            return
        print(
            f"{args.records} records/run, batches of {args.batch}, {args.concurrency} client(s), "
            f"{args.workers} API worker(s), prompt as {args.prompt}"
        )
        api_rates, copy_rates, v2_rates = [], [], []
        shape = {
            "prompt_len": 512,
            "out_len": 256,
            "top_k": 5,
            "model": "bench-model",
            "text_prompt": args.prompt == "text",
        }
        for run in range(args.runs):
            items = [
                wire_item(env.canonical, disclosures)
                for env, disclosures in (
                    record_v2(key, fp_id, **shape) for _ in range(args.records)
                )
            ]
            v2_bodies = [
                b'{"records":[' + b",".join(items[i : i + args.batch]) + b"]}"
                for i in range(0, len(items), args.batch)
            ]
            before = (process_cpu(proc.pid), postgres_cpu())
            v2_s = post_all(url, token, v2_bodies, args.concurrency)
            v2_cpu = [
                (b - a) * 1000 / args.records
                for a, b in zip(before, (process_cpu(proc.pid), postgres_cpu()), strict=True)
            ]
            v2_rates.append(args.records / v2_s)
            envs = [record_envelope(key, fp_id, **shape) for _ in range(args.records)]  # type: ignore[arg-type]
            bodies = [
                b'{"envelopes":[' + b",".join(e.canonical for e in envs[i : i + args.batch]) + b"]}"
                for i in range(0, len(envs), args.batch)
            ]
            cpu_before = worker_cpu(proc.pid)
            api_s = post_all(url, token, bodies, args.concurrency)
            cpu_after = worker_cpu(proc.pid)
            # How the work fell on the API workers: with few client connections, the kernel
            # may hand them all to one worker, whose single Python thread then bounds the rate.
            used = [cpu_after[p] - cpu_before.get(p, 0.0) for p in sorted(cpu_after)]
            shares = [x for x in used if x > 0.005 * sum(used)]  # not the idle helper process
            split = " / ".join(f"{x / max(sum(shares), 1e-9):.0%}" for x in shares)
            copy_s = copy_rows(db_url, envs, f"copy_scratch_{run}")
            api_rates.append(args.records / api_s)
            copy_rates.append(args.records / copy_s)
            print(
                f"run {run + 1}: v2 {v2_rates[-1]:,.0f} records/s "
                f"({sum(map(len, v2_bodies)) / args.records / 1024:.1f} KiB/record; CPU per "
                f"record: ledger {v2_cpu[0]:.3f} ms, Postgres {v2_cpu[1]:.3f} ms), "
                f"v1 API {api_rates[-1]:,.0f} records/s, COPY {copy_rates[-1]:,.0f} "
                f"rows/s, ratio {api_rates[-1] / copy_rates[-1]:.2f} "
                f"({sum(map(len, bodies)) / args.records / 1024:.1f} KiB/record on the wire; "
                f"API worker CPU split {split or 'n/a'})"
            )
        api_med, copy_med = statistics.median(api_rates), statistics.median(copy_rates)
        v2_med = statistics.median(v2_rates)
        ratios = [a / b for a, b in zip(v2_rates, api_rates, strict=True)]
        print(
            f"median: v2 {v2_med:,.0f} records/s; v1 {api_med:,.0f} records/s; v2/v1 "
            f"{statistics.median(ratios):.2f} (per run); COPY {copy_med:,.0f} rows/s; "
            f"v1/COPY {api_med / copy_med:.2f}"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


if __name__ == "__main__":
    main()
