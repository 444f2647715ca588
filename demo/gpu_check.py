"""The GPU check (``ledger gpu-check``): the whole loop on this host's engine, measured.

Builds the fixture model, starts the ledger (embedded SQLite in ``--data-dir``) and two vLLM
pools with a collector beside each: ``strict`` (on a GPU ``VLLM_BATCH_INVARIANT=1``, vLLM's
batch-invariant kernels; on CPU one sequence at a time with prefix caching and chunked prefill
off) and ``throughput`` (vLLM's defaults). Then, each step timed:

1. the fingerprint each collector made (GPUs through real NVML: name, driver, every field
   filled?), and each pool's batch invariance;
2. the collector's cost: the same greedy requests straight to the engine and through the
   collector, paired one at a time (added p50) and as a concurrent batch (throughput ratio);
3. ``--requests`` mixed requests (chat and completions, streamed or not, greedy, seeded and
   sampled, tiers 0-2) at ``--concurrency`` across both pools; every answer recorded;
4. every deterministic strict record replayed (expected: 100% ``bitwise``), and a sample of
   throughput records replayed on their own pool, forced (what batch variance does);
5. both pools certified at ``--certify-concurrency``.

The report (``--out``, JSON) and a table: ``make gpu-check`` on a host with an NVIDIA GPU and
vLLM's CUDA build; ``--device cpu`` with small sizes runs in ``make test``. The exit status is
1 when a strict record does not replay bitwise or the strict pool does not certify invariant.
"""

from __future__ import annotations

import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from api.app import create_app
from api.settings import Settings
from client.ledger_client import LedgerClient
from demo.engine import EngineDemo, Pools, open_embedded_ledger, register_demo_keys
from demo.errors import DemoTrouble
from demo.server_thread import ServerThread, free_port
from demo.traffic import mixed_request, run_certification, send, wait_record
from fixture_model.engine import STRICT_ARGS
from ledger.cachekey import is_deterministic
from ledger.errors import LedgerError
from ledger.inference_record import body_view

GPU_POOLS: Pools = {
    "throughput": (("--gpu-memory-utilization", "0.35"), {}),
    "strict": (("--gpu-memory-utilization", "0.35"), {"VLLM_BATCH_INVARIANT": "1"}),
}
CPU_POOLS: Pools = {"throughput": ((), {}), "strict": (STRICT_ARGS, {})}
PAIRED_PROMPT = "A fingerprint names the model, the libraries and"


class _Clock:
    """Seconds per step, in order."""

    def __init__(self) -> None:
        self.steps: dict[str, float] = {}
        self._at = time.perf_counter()

    def lap(self, step: str) -> float:
        now = time.perf_counter()
        self.steps[step] = round(now - self._at, 3)
        self._at = now
        return self.steps[step]


def has_cuda_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount()) > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no library, no driver: not a GPU host
        return False


def _post(url: str, body: dict[str, Any]) -> tuple[float, httpx.Response]:
    """A completion and its wall time."""
    started = time.perf_counter()
    answer = send(url, "/v1/completions", body, 0)
    return time.perf_counter() - started, answer


def overhead(engine_url: str, collector_url: str, pairs: int, concurrency: int) -> dict[str, Any]:
    """Straight to the engine against through the collector, the same greedy requests."""
    body = {"prompt": PAIRED_PROMPT, "max_tokens": 16, "temperature": 0}
    added = []
    for _ in range(pairs):  # paired, one at a time: the collector's added latency
        straight, _ = _post(engine_url, body)
        through, answer = _post(collector_url, body)
        if answer.status_code != 200:
            raise DemoTrouble(f"the collector answered {answer.status_code}: {answer.text[:300]}")
        added.append((through - straight) * 1000)

    def batch(url: str) -> float:
        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda _: _post(url, body), range(concurrency * 2)))
        return concurrency * 2 / (time.perf_counter() - started)

    straight_rate, through_rate = batch(engine_url), batch(collector_url)
    return {
        "added_p50_ms": round(statistics.median(added), 2),
        "pairs": pairs,
        "requests_per_s_straight": round(straight_rate, 2),
        "requests_per_s_collector": round(through_rate, 2),
        "throughput_ratio": round(through_rate / straight_rate, 3),
        "concurrency": concurrency,
    }


def _gpu_facts(snapshot: Any) -> dict[str, Any]:
    gpu = snapshot.body["gpu"]
    devices = gpu.get("gpus") or []
    return {
        "driver_version": gpu.get("driver_version"),
        "cuda_driver_version": gpu.get("cuda_driver_version"),
        "gpus": devices,
        "uuids": snapshot.identity["gpu"].get("gpu_uuids"),
        "every_field_filled": bool(devices)
        and not gpu.get("unknown")
        and all(value is not None for d in devices for value in d.values()),
        "unknown": gpu.get("unknown"),
    }


def traffic(
    workers: dict[str, Any], client: LedgerClient, requests: int, concurrency: int
) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Mixed requests across the pools at ``concurrency``; every answer's record awaited."""
    pools = list(workers)
    jobs = [
        (pools[i % len(pools)], *mixed_request(pools[i % len(pools)], i)) for i in range(requests)
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(lambda j: send(workers[j[0]].url, j[1], j[2], j[3]), jobs))
    seconds = time.perf_counter() - started
    ids: dict[str, list[str]] = {p: [] for p in pools}
    for (pool_name, *_), answer in zip(jobs, answers, strict=True):
        if answer.status_code != 200:
            raise DemoTrouble(f"{pool_name} answered {answer.status_code}: {answer.text[:300]}")
        ids[pool_name].append(answer.headers["x-request-id"])
    for request_ids in ids.values():
        for request_id in request_ids:
            wait_record(client, request_id, timeout=300)
    return ids, {
        "requests": requests,
        "concurrency": concurrency,
        "seconds": round(seconds, 3),
        "requests_per_s": round(requests / seconds, 2),
        "recorded": sum(map(len, ids.values())),
    }


def replays(client: LedgerClient, ids: dict[str, list[str]], sample: int) -> dict[str, Any]:
    """Every deterministic strict record on its pool, and a sample of throughput records
    forced onto theirs."""
    out: dict[str, Any] = {}
    for pool, wanted in (("strict", None), ("throughput", sample)):
        verdicts: dict[str, int] = {}
        observed: dict[str, int] = {}  # a forced replay's comparison, whatever its verdict
        skipped = 0
        started = time.perf_counter()
        done = 0
        for request_id in ids[pool]:
            if wanted is not None and done >= wanted:
                break
            request = body_view(client.get_record(request_id))["request"]
            if not is_deterministic(request):
                skipped += 1  # sampled without a seed: no output to reproduce
                continue
            try:
                body = client.replay(request_id, pool, pool != "strict")["envelope"]["body"]
                verdict = body["verdict"]
                seen = (body.get("comparison") or {}).get("verdict", verdict)
            except LedgerError as exc:
                verdict = seen = f"refused: {exc.code}"
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
            observed[seen] = observed.get(seen, 0) + 1
            done += 1
        seconds = time.perf_counter() - started
        out[pool] = {
            "replayed": done,
            "verdicts": verdicts,
            "observed": observed,
            "bitwise_rate": round(verdicts.get("bitwise", 0) / done, 4) if done else None,
            "not_deterministic": skipped,
            "seconds": round(seconds, 3),
            "seconds_per_replay": round(seconds / done, 3) if done else None,
        }
    return out


def certify(
    client: LedgerClient, pool: str, concurrency: list[int], prompts: int
) -> dict[str, Any]:
    started = time.perf_counter()
    params = {"pool": pool, "prompts": prompts, "concurrency": concurrency, "max_tokens": [16]}
    job = run_certification(client, params)
    body = job["envelope"]["body"]
    return {
        "invariant": body["invariant_observed"],
        "cells": [
            {k: r[k] for k in ("concurrency", "requests", "bitwise")} for r in body["results"]
        ],
        "seconds": round(time.perf_counter() - started, 3),
        "log_index": job["log_index"],
    }


def run_gpu_check(
    settings: Settings,
    mode: str,
    engine_python: Path,
    *,
    requests: int,
    concurrency: int,
    levels: list[int],
    certify_prompts: int,
    throughput_sample: int,
    pairs: int,
) -> dict[str, Any]:
    """The whole loop on ``mode`` (``cuda`` or ``cpu``), each step timed: the report."""
    clock = _Clock()
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    db, boot, token = open_embedded_ledger(settings, "gpu-check")
    server = ServerThread(create_app(settings, db, boot.log_key), "127.0.0.1", free_port())
    server.start()
    engine: EngineDemo | None = None
    report: dict[str, Any] = {
        "device": mode,
        "host": {"machine": platform.machine(), "python": platform.python_version()},
    }
    try:
        with LedgerClient(server.url, token) as client:
            pools = GPU_POOLS if mode == "cuda" else CPU_POOLS
            keys = register_demo_keys(client, data_dir, pools)
            clock.lap("ledger")
            engine = EngineDemo(str(engine_python), data_dir, server.url, token, pools, "gpu-check")
            engine.start(keys)
            clock.lap("engines and collectors")
            report["pools"] = {}
            for pool, worker in engine.workers.items():
                snapshot = worker.collector.snapshot
                report["pools"][pool] = {
                    "fingerprint_id": snapshot.fingerprint_id,
                    "batch_invariance": snapshot.body["engine"]["batch_invariance"],
                    "engine_version": snapshot.body["engine"]["version"],
                    "runtime": {
                        k: snapshot.body["runtime"].get(k)
                        for k in ("vllm", "torch", "torch_cuda", "cuda_runtime", "cublas")
                    },
                    "gpu": _gpu_facts(snapshot),
                }
                report["pools"][pool]["overhead"] = overhead(
                    worker.engine.url, worker.url, pairs, min(concurrency, 16)
                )
                clock.lap(f"overhead {pool}")
            ids, report["traffic"] = traffic(engine.workers, client, requests, concurrency)
            clock.lap("traffic")
            report["replays"] = replays(client, ids, throughput_sample)
            clock.lap("replays")
            report["certification"] = {
                pool: certify(client, pool, levels, certify_prompts)
                for pool in ("strict", "throughput")
            }
            clock.lap("certification")
    finally:
        if engine is not None:
            engine.close()
        server.stop()
    strict = report["replays"]["strict"]
    report["passed"] = bool(
        strict["replayed"]
        and strict["bitwise_rate"] == 1.0
        and report["certification"]["strict"]["invariant"]
    )
    report["timings"] = clock.steps
    return report
