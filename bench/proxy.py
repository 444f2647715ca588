"""Collector overhead: the same workload straight to vLLM and through `ledger collect`.

Starts, as separate processes: a vLLM CPU server on the small fixture model (default
scheduler), `ledger serve` (embedded SQLite) and `ledger collect` in front of the engine. Then,
for each concurrency (default 1 and 16):

- throughput: it sends the same requests (fixed prompts, greedy, --max-tokens tokens) straight
  to vLLM and through the collector, one whole batch after the other, --runs times, and reports
  medians: requests/s and their ratio, p50/p99 latency and their differences;
- added latency, paired: each prompt goes three ways back to back (the order rotating), from
  `concurrency` workers at once: straight, straight with what the collector asks the engine
  for (token IDs and logprobs), and through the collector; all three meet the same engine
  load. Over --runs batches it reports p50/p99 through minus straight and the medians of the
  per-prompt differences: in all, the engine's work for the record's fields, and the
  collector's own. Whole-batch differences carry the engine's batch-to-batch variation (tens
  of ms on a CPU engine), which pairing cancels;

plus the collector's own added-latency histogram (parse, sign, spool, reshape) and the CPU the
collector and the ledger used per recorded request. Targets: throughput ratio >= 0.95, added
p50 <= 3 ms.

    .venv/bin/python bench/proxy.py --requests 64 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
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
from client.ledger_client import LedgerClient  # noqa: E402
from demo.server_thread import free_port  # noqa: E402
from fixture_model import build  # noqa: E402
from fixture_model.engine import DEFAULT_ENGINE_PYTHON, EngineServer, start_engines  # noqa: E402
from ledger.signing import SigningKey, public_key_pem  # noqa: E402

LEDGER = [sys.executable, "-m", "cli"]


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer")


def prompts(count: int) -> list[str]:
    rng = random.Random(42)
    words = [
        "the",
        "ledger",
        "records",
        "every",
        "answer",
        "a",
        "model",
        "gives",
        "and",
        "proves",
        "it",
        "later",
    ]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) for _ in range(count)]


def completion(
    prompt: str, max_tokens: int, extra: dict[str, object] | None = None
) -> dict[str, object]:
    """The benchmark's request: greedy, exactly ``max_tokens`` tokens."""
    return {
        "model": "fixture",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **(extra or {}),
    }


async def run_load(
    url: str, batch: list[str], concurrency: int, max_tokens: int
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    queue = list(enumerate(batch))
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def worker() -> None:
            while queue:
                _, prompt = queue.pop(0)
                start = time.perf_counter()
                response = await client.post("/v1/completions", json=completion(prompt, max_tokens))
                response.raise_for_status()
                latencies.append(time.perf_counter() - start)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return len(batch) / elapsed, latencies


# What the collector adds to a completions request the client sent without logprobs or
# token IDs (collectors/exchange.py: plan): the record's token IDs and float32 logprobs.
RECORD_NEEDS: dict[str, object] = {"return_token_ids": True, "logprobs": 0}
VARIANTS = ("straight", "straight_with_record_fields", "through")


async def run_triples(
    direct_url: str, collector_url: str, batch: list[str], concurrency: int, max_tokens: int
) -> list[dict[str, float]]:
    """Each prompt sent three ways, back to back (the order rotating from prompt to prompt),
    by `concurrency` workers: straight; straight with what the collector asks the engine for
    (RECORD_NEEDS); through the collector. All three meet the same engine load, so what the
    engine does differently from one batch to the next falls on every side alike; the
    differences split the added latency into the engine's work for the record and the
    collector's own."""
    out: list[dict[str, float]] = []
    queue = list(enumerate(batch))
    ways: dict[str, tuple[str, dict[str, object]]] = {
        "straight": (direct_url, {}),
        "straight_with_record_fields": (direct_url, RECORD_NEEDS),
        "through": (collector_url, {}),
    }
    async with httpx.AsyncClient(timeout=600) as client:

        async def timed(way: str, prompt: str) -> float:
            url, extra = ways[way]
            body = completion(prompt, max_tokens, extra)
            start = time.perf_counter()
            response = await client.post(url + "/v1/completions", json=body)
            response.raise_for_status()
            return time.perf_counter() - start

        async def worker() -> None:
            while queue:
                i, prompt = queue.pop(0)
                order = VARIANTS[i % 3 :] + VARIANTS[: i % 3]
                out.append({way: await timed(way, prompt) for way in order})

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def collector_overhead(url: str) -> tuple[float, float]:
    """Mean added latency (ms) from the collector's histogram, and its request count."""
    text = httpx.get(f"{url}/metrics").text
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("collector_added_latency_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("collector_added_latency_seconds_count"):
            count = float(line.split()[-1])
    return (1000 * total / count if count else 0.0), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--engine-cpus",
        default="0" if (os.cpu_count() or 1) <= 4 else "auto",
        help="VLLM_CPU_OMP_THREADS_BIND for the engine's compute threads (default on a small "
        "machine: CPU 0, leaving the others to the frontends, as a GPU would)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ledger-proxy-bench-"))
    model = build(work / "model", size="small")
    engine = EngineServer(
        model,
        (),
        work / "vllm.log",
        str(DEFAULT_ENGINE_PYTHON),
        env={"VLLM_CPU_OMP_THREADS_BIND": args.engine_cpus},
    )
    start_engines([engine])
    procs: list[subprocess.Popen[bytes]] = []
    logs = [(work / f"{name}.log").open("wb") for name in ("ledger", "collector")]
    try:
        ledger_port, collect_port = free_port(), free_port()
        env = {
            **os.environ,
            "LEDGER_DATA_DIR": str(work / "ledger"),
            "LEDGER_PORT": str(ledger_port),
        }
        procs.append(
            subprocess.Popen([*LEDGER, "serve"], env=env, stdout=logs[0], stderr=subprocess.STDOUT)
        )
        ledger_url = f"http://127.0.0.1:{ledger_port}"
        wait_http(ledger_url + "/healthz", procs[-1])
        token = (work / "ledger" / "admin.token").read_text().strip()
        key = SigningKey.generate()
        (work / "collector.pem").write_bytes(key.private_pem())
        (work / "token").write_text(token)
        LedgerClient(ledger_url, token).register_key(
            "bench", "collector", public_key_pem(key.public_key)
        )
        procs.append(
            subprocess.Popen(
                [
                    *LEDGER,
                    "collect",
                    "--engine-url",
                    engine.url,
                    "--listen",
                    f"127.0.0.1:{collect_port}",
                    "--ledger",
                    ledger_url,
                    "--token-file",
                    str(work / "token"),
                    "--key",
                    str(work / "collector.pem"),
                    "--pool",
                    "bench",
                    "--model-dir",
                    str(model),
                    "--spool",
                    str(work / "spool.sqlite"),
                ],
                env={**os.environ, "LEDGER_DIGEST_CACHE": str(work / "digests.sqlite")},
                stdout=logs[1],
                stderr=subprocess.STDOUT,
            )
        )
        collect_url = f"http://127.0.0.1:{collect_port}"
        wait_http(collect_url + "/metrics", procs[-1])
        batch = prompts(args.requests)
        asyncio.run(run_load(engine.url, batch[:4], 4, args.max_tokens))  # warm-up
        asyncio.run(run_load(collect_url, batch[:4], 4, args.max_tokens))
        if args.engine_cpus != "auto":
            # Everything but the engine's compute (this load generator, the ledger, the
            # collector, vLLM's own frontend) shares the remaining CPUs, in both modes.
            others = set(range(os.cpu_count() or 1)) - {int(c) for c in args.engine_cpus.split(",")}
            for pid in [0, *(p.pid for p in procs)]:
                os.sched_setaffinity(pid, others or {0})
        results = {}
        cpu_before = {
            name: cpu_seconds(p.pid) for name, p in zip(("ledger", "collector"), procs, strict=True)
        }
        proxied = 0
        for conc in (int(c) for c in args.concurrency.split(",")):
            rows: dict[str, list[tuple[float, float, float]]] = {"direct": [], "collector": []}
            for run in range(args.runs):
                for name, url in (("direct", engine.url), ("collector", collect_url)):
                    rps, lat = asyncio.run(run_load(url, batch, conc, args.max_tokens))
                    proxied += len(batch) if name == "collector" else 0
                    rows[name].append((rps, pct(lat, 0.5), pct(lat, 0.99)))
                    print(
                        f"concurrency {conc} run {run + 1} {name}: {rps:.2f} req/s, "
                        f"p50 {1000 * pct(lat, 0.5):.1f} ms, p99 {1000 * pct(lat, 0.99):.1f} ms",
                        flush=True,
                    )
            med = {
                n: [statistics.median(r[i] for r in v) for i in range(3)] for n, v in rows.items()
            }
            triples = []
            for _ in range(args.runs):
                triples += asyncio.run(
                    run_triples(engine.url, collect_url, batch, conc, args.max_tokens)
                )
                proxied += len(batch)
            by_way = {way: [t[way] for t in triples] for way in VARIANTS}

            def median_ms(a: str, b: str, ts: list[dict[str, float]] = triples) -> float:
                return 1000 * statistics.median(t[b] - t[a] for t in ts)

            print(
                f"concurrency {conc} paired, {len(triples)} prompts: straight p50 "
                f"{1000 * pct(by_way['straight'], 0.5):.1f} ms, through p50 "
                f"{1000 * pct(by_way['through'], 0.5):.1f} ms, median difference "
                f"{median_ms('straight', 'through'):.2f} ms",
                flush=True,
            )
            results[conc] = {
                "direct_rps": med["direct"][0],
                "collector_rps": med["collector"][0],
                "ratio": med["collector"][0] / med["direct"][0],
                "direct_p50_ms": 1000 * med["direct"][1],
                "collector_p50_ms": 1000 * med["collector"][1],
                "added_p50_ms": 1000 * (med["collector"][1] - med["direct"][1]),
                "direct_p99_ms": 1000 * med["direct"][2],
                "collector_p99_ms": 1000 * med["collector"][2],
                "added_p99_ms": 1000 * (med["collector"][2] - med["direct"][2]),
                "paired_prompts": len(triples),
                "paired_added_p50_ms": 1000
                * (pct(by_way["through"], 0.5) - pct(by_way["straight"], 0.5)),
                "paired_added_p99_ms": 1000
                * (pct(by_way["through"], 0.99) - pct(by_way["straight"], 0.99)),
                "paired_median_difference_ms": median_ms("straight", "through"),
                "engine_record_fields_ms": median_ms("straight", "straight_with_record_fields"),
                "collector_own_ms": median_ms("straight_with_record_fields", "through"),
            }
        own_ms, own_count = collector_overhead(collect_url)
        time.sleep(1)  # let the last batch ship
        cpu_ms = {
            name: 1000 * (cpu_seconds(p.pid) - cpu_before[name]) / max(1, proxied)
            for name, p in zip(("ledger", "collector"), procs, strict=True)
        }
        pending = LedgerClient(ledger_url, token).search_records(
            pool="bench", limit=1, fields="meta"
        )
        if args.json:
            print(
                json.dumps(
                    {
                        "machine": machine(),
                        "results": results,
                        "collector_own_mean_ms": own_ms,
                        "cpu_ms_per_request": cpu_ms,
                    },
                    indent=2,
                )
            )
            return
        print(
            f"\n{machine()}; {args.requests} requests x {args.max_tokens} tokens, "
            f"median of {args.runs} runs; engine compute on CPUs {args.engine_cpus}"
        )
        print(
            "| concurrency | straight req/s | collector req/s | ratio (>= 0.95) "
            "| p50 straight / through | added p50 (<= 3 ms) | added p99 |"
        )
        print("|---|---|---|---|---|---|---|")
        for conc, r in results.items():
            print(
                f"| {conc} | {r['direct_rps']:.2f} | {r['collector_rps']:.2f} | {r['ratio']:.3f} | "
                f"{r['direct_p50_ms']:.1f} / {r['collector_p50_ms']:.1f} ms | "
                f"{r['added_p50_ms']:.2f} ms | "
                f"{r['added_p99_ms']:.2f} ms |"
            )
        print(
            "\nPaired (each prompt straight, straight with the record's fields, and through, "
            "back to back, same engine load; medians of the per-prompt differences):"
        )
        print(
            "| concurrency | prompts | added p50 (<= 3 ms) | added p99 | median added | of which "
            "the engine's work for the record (token IDs, logprobs) | of which the collector |"
        )
        print("|---|---|---|---|---|---|---|")
        for conc, r in results.items():
            print(
                f"| {conc} | {r['paired_prompts']} | {r['paired_added_p50_ms']:.2f} ms | "
                f"{r['paired_added_p99_ms']:.2f} ms | {r['paired_median_difference_ms']:.2f} ms | "
                f"{r['engine_record_fields_ms']:.2f} ms | {r['collector_own_ms']:.2f} ms |"
            )
        print(
            f"CPU per recorded request: collector {cpu_ms['collector']:.2f} ms, "
            f"ledger {cpu_ms['ledger']:.2f} ms"
        )
        print(
            f"collector's own processing (parse, sign, spool, reshape): mean {own_ms:.2f} ms over "
            f"{own_count:.0f} requests; ledger holds records: {bool(pending['items'])}"
        )
    except BaseException:
        print(f"failed; the engine's, ledger's and collector's logs are in {work}", file=sys.stderr)
        raise
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        engine.stop()
        for log in logs:
            log.close()


if __name__ == "__main__":
    main()
