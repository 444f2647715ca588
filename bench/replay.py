"""Replay overhead: what a replay costs beyond the worker's own inference time.

Starts, as separate processes: a strict vLLM CPU server on the small fixture model, `ledger
serve` (embedded SQLite) and `ledger collect` beside the engine, registered as a worker.
Records --requests greedy completions through the collector, then replays each of them
(POST /v1/replays) --runs times, one at a time. For every replay:

    overhead = client-observed replay latency - the engine's time for the re-run
               (the collector measures it around the engine call: timings.total_ns)

so it covers everything else: the API, reading the record, choosing the worker, signing the
order, the order's HTTP round trip, the collector's checks and signing, verifying the output,
the comparison, signing the verdict and appending it to the log. Target: p50 <= 20 ms.

    .venv/bin/python bench/replay.py --requests 24 --runs 3
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

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest import machine  # noqa: E402
from bench.proxy import LEDGER, pct, prompts, wait_http  # noqa: E402
from client.ledger_client import LedgerClient  # noqa: E402
from demo.server_thread import free_port  # noqa: E402
from fixture_model import build  # noqa: E402
from fixture_model.engine import (  # noqa: E402
    DEFAULT_ENGINE_PYTHON,
    STRICT_ARGS,
    EngineServer,
    start_engines,
)
from ledger.signing import SigningKey, public_key_pem  # noqa: E402


def start_ledger(work: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    port = free_port()
    env = {**os.environ, "LEDGER_DATA_DIR": str(work / "ledger"), "LEDGER_PORT": str(port)}
    proc = subprocess.Popen(
        [*LEDGER, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", proc)
    return proc, url, (work / "ledger" / "admin.token").read_text().strip()


def start_collector(
    work: Path, engine: EngineServer, ledger_url: str, token: str
) -> tuple[subprocess.Popen[bytes], str]:
    key = SigningKey.generate()
    (work / "collector.pem").write_bytes(key.private_pem())
    (work / "token").write_text(token)
    LedgerClient(ledger_url, token).register_key(
        "bench", "collector", public_key_pem(key.public_key)
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            *LEDGER,
            "collect",
            *("--engine-url", engine.url, "--listen", f"127.0.0.1:{port}"),
            *("--ledger", ledger_url, "--token-file", str(work / "token")),
            *("--key", str(work / "collector.pem"), "--pool", "strict", "--worker-id", "w1"),
            *("--model-dir", str(engine.model_dir), "--spool", str(work / "spool.sqlite")),
        ],
        env={**os.environ, "LEDGER_DIGEST_CACHE": str(work / "digests.sqlite")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/metrics", proc)
    return proc, url


def wait_live(client: httpx.Client, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pools = client.get("/v1/pools").json()["items"]
        if any(p["live_workers"] for p in pools):
            return
        time.sleep(0.2)
    raise SystemExit("the collector did not register as a worker")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ledger-replay-bench-"))
    model = build(work / "model", size="small")
    engine = EngineServer(model, STRICT_ARGS, work / "vllm.log", str(DEFAULT_ENGINE_PYTHON))
    start_engines([engine])
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ledger_proc, ledger_url, token = start_ledger(work)
        procs.append(ledger_proc)
        collector_proc, collector_url = start_collector(work, engine, ledger_url, token)
        procs.append(collector_proc)
        api = httpx.Client(
            base_url=ledger_url, headers={"Authorization": f"Bearer {token}"}, timeout=300
        )
        wait_live(api)
        ids = []
        with httpx.Client(base_url=collector_url, timeout=300) as http:
            for prompt in prompts(args.requests):
                body = {
                    "model": "fixture",
                    "prompt": prompt,
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                }
                response = http.post("/v1/completions", json=body)
                response.raise_for_status()
                ids.append(response.headers["x-request-id"])
        for request_id in ids:
            while api.get(f"/v1/records/{request_id}").status_code != 200:
                time.sleep(0.1)
        api.post("/v1/replays", json={"request_id": ids[0]}).raise_for_status()  # warm-up
        runs = []
        verdicts: dict[str, int] = {}
        for run in range(args.runs):
            overhead, engine_ms, total_ms = [], [], []
            for request_id in ids:
                began = time.perf_counter()
                response = api.post("/v1/replays", json={"request_id": request_id})
                elapsed = time.perf_counter() - began
                response.raise_for_status()
                verdict = response.json()["envelope"]["body"]
                verdicts[verdict["verdict"]] = verdicts.get(verdict["verdict"], 0) + 1
                inference = int(verdict["output"]["body"]["timings"]["total_ns"]) / 1e9
                overhead.append(1000 * (elapsed - inference))
                engine_ms.append(1000 * inference)
                total_ms.append(1000 * elapsed)
            runs.append(
                {
                    "overhead_p50_ms": pct(overhead, 0.5),
                    "overhead_p99_ms": pct(overhead, 0.99),
                    "engine_p50_ms": pct(engine_ms, 0.5),
                    "replay_p50_ms": pct(total_ms, 0.5),
                }
            )
            last = runs[-1]
            print(
                f"run {run + 1}: overhead p50 {last['overhead_p50_ms']:.2f} ms, "
                f"p99 {last['overhead_p99_ms']:.2f} ms; engine p50 "
                f"{last['engine_p50_ms']:.1f} ms; replay p50 {last['replay_p50_ms']:.1f} ms",
                flush=True,
            )
        summary = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        if args.json:
            print(json.dumps({"machine": machine(), "runs": runs, "median": summary}, indent=2))
            return
        print(
            f"\n{machine()}; {len(ids)} records x {args.max_tokens} tokens replayed "
            f"{args.runs} times (verdicts {verdicts}); medians of the runs:"
        )
        print("| replay p50 | engine's re-run p50 | overhead p50 (<= 20 ms) | overhead p99 |")
        print("|---|---|---|---|")
        print(
            f"| {summary['replay_p50_ms']:.1f} ms | {summary['engine_p50_ms']:.1f} ms | "
            f"{summary['overhead_p50_ms']:.2f} ms | {summary['overhead_p99_ms']:.2f} ms |"
        )
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        engine.stop()


if __name__ == "__main__":
    main()
