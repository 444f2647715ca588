"""What each field the collector asks for costs the engine alone, with no collector running.

Starts a vLLM CPU server on the small fixture model (default scheduler, compute on CPU 0 as in
bench/proxy.py) and sends each prompt once per variant, back to back, the order rotating from
prompt to prompt, one request at a time:

- plain: what a client sends (greedy, --max-tokens tokens, nothing else);
- token_ids: plus ``return_token_ids``;
- logprobs: plus ``logprobs: 0`` (the sampled token's logprob);
- record_fields: both, which is what the collector adds (bench/proxy.py RECORD_NEEDS);
- record_fields_as_ids: both, with ``return_tokens_as_token_ids``.

For each variant it prints the p50 latency and the median of the per-prompt differences from
plain, per run and as the median over --runs runs. This is the engine's share of the
collector's added latency, which no change to the collector can remove.

With --pin, vLLM's engine core and model worker are held on the engine's CPU and its API
server (with this load generator) on the other CPUs, as on a GPU host where the frontend has
cores of its own: it shows how much of the cost is the frontend competing for a CPU with the
engine's step rather than adding to it.

    .venv/bin/python bench/engine_fields.py --requests 60 --runs 3 [--pin]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest import machine  # noqa: E402
from bench.proxy import RECORD_NEEDS, completion, prompts  # noqa: E402
from fixture_model import build  # noqa: E402
from fixture_model.engine import DEFAULT_ENGINE_PYTHON, EngineServer, start_engines  # noqa: E402

FIELDS: dict[str, dict[str, object]] = {
    "plain": {},
    "token_ids": {"return_token_ids": True},
    "logprobs": {"logprobs": 0},
    "record_fields": RECORD_NEEDS,
    "record_fields_as_ids": {**RECORD_NEEDS, "return_tokens_as_token_ids": True},
}


async def one_run(url: str, batch: list[str], max_tokens: int) -> dict[str, list[float]]:
    """Latency (ms) of every prompt in every variant."""
    names = list(FIELDS)
    out: dict[str, list[float]] = {name: [] for name in names}
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for i, prompt in enumerate(batch):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                body = completion(prompt, max_tokens, FIELDS[name])
                start = time.perf_counter()
                response = await client.post("/v1/completions", json=body)
                response.raise_for_status()
                out[name].append(1000 * (time.perf_counter() - start))
    return out


def children(pid: int) -> list[int]:
    """Every descendant of a process, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def pin(engine: EngineServer) -> None:
    """Engine core and worker (vLLM's children) on one CPU; its API server and us on the rest."""
    allowed = os.sched_getaffinity(0)
    core = min(allowed)
    others = allowed - {core} or {core}
    for pid, cpus in [*((p, {core}) for p in children(engine.pid)), (engine.pid, others)]:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), cpus)
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), others)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pin", action="store_true", help="engine on CPU 0, frontend apart")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ledger-engine-fields-"))
    engine = EngineServer(
        build(work / "model", size="small"),
        (),
        work / "vllm.log",
        str(DEFAULT_ENGINE_PYTHON),
        env={"VLLM_CPU_OMP_THREADS_BIND": "0"},
    )
    start_engines([engine])
    try:
        if args.pin:
            pin(engine)
        batch = prompts(args.requests)
        asyncio.run(one_run(engine.url, batch[:4], args.max_tokens))  # warm-up
        added: dict[str, list[float]] = {name: [] for name in FIELDS}
        p50: dict[str, list[float]] = {name: [] for name in FIELDS}
        for run in range(args.runs):
            times = asyncio.run(one_run(engine.url, batch, args.max_tokens))
            for name, values in times.items():
                p50[name].append(statistics.median(values))
                added[name].append(
                    statistics.median(a - b for a, b in zip(values, times["plain"], strict=True))
                )
            print(
                f"run {run + 1}: "
                + ", ".join(f"{n} +{added[n][-1]:.2f} ms" for n in FIELDS if n != "plain"),
                flush=True,
            )
    finally:
        engine.stop()
    print(
        f"\n{machine()}; {args.requests} prompts x {args.max_tokens} tokens, one at a time, "
        f"median of {args.runs} runs"
        + ("; engine core and worker on CPU 0, API server apart" if args.pin else "")
    )
    print("| asked of the engine | p50 | added over plain (median per-prompt difference) |")
    print("|---|---|---|")
    for name in FIELDS:
        print(
            f"| {name} | {statistics.median(p50[name]):.2f} ms "
            f"| {statistics.median(added[name]):.2f} ms |"
        )


if __name__ == "__main__":
    main()
