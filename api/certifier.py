"""Certification jobs: run the replay matrix (``ledger.certify``) on a pool's worker.

A job runs in the API process as an asyncio task; ``GET /v1/certifications/{id}`` reports its
progress and, when done, the signed certificate (a log leaf). Jobs live in memory: a restart
of the API abandons running ones (the certificate is only logged when a job completes).
Every probe goes through the replay channel (a log-key-signed order to the worker's
collector), so probes are never recorded as traffic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from api.state import AppState
from api.workers_client import WorkerAnswer, run_order
from ledger import certify
from ledger.compare import Comparison, Generation, compare
from ledger.errors import Conflict, InvalidInput, LedgerError, NotFound
from ledger.replay import output_generation
from ledger.storage import cache, verdicts, workers
from ledger.storage.workers import WorkerInfo

logger = logging.getLogger("ledger.certify")
DEFAULT_MAX_MODEL_LEN = 2048


@dataclass
class Job:
    job_id: str
    pool: str
    worker: WorkerInfo
    parameters: dict[str, Any]
    total: int
    done: int = 0
    status: str = "running"  # running | done | failed
    error: dict[str, Any] | None = None
    certificate: verdicts.Stored | None = None
    # Held so the running task is not garbage-collected (the loop keeps only a weak reference).
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "certification_id": self.job_id,
            "pool": self.pool,
            "worker_id": self.worker.worker_id,
            "fingerprint_id": self.worker.fingerprint_id,
            "status": self.status,
            "done": self.done,
            "total": self.total,
            "parameters": self.parameters,
            "error": self.error,
        }
        if self.certificate is not None:
            out["certificate_id"] = self.certificate.id
            out["log_index"] = self.certificate.log_index
            out["envelope"] = json.loads(self.certificate.envelope)
        return out


def _validate(concurrency: list[int], max_tokens: list[int]) -> None:
    if any(not 1 <= c <= 256 for c in concurrency):
        raise InvalidInput("concurrency values must be 1..256", code="invalid_parameters")
    if any(not 1 <= m <= 4096 for m in max_tokens):
        raise InvalidInput("max_tokens values must be 1..4096", code="invalid_parameters")


def _total(prompts: int, concurrency: list[int], max_tokens: list[int]) -> int:
    per = 2 * prompts + sum(_wave_size(prompts, c) for c in concurrency if c > 1)
    return per * len(max_tokens)


def _wave_size(prompts: int, c: int) -> int:
    """Requests for concurrency ``c``: every prompt at least once, in full waves of ``c``."""
    return -(-prompts // c) * c


def start(
    state: AppState,
    pool: str,
    prompts: int,
    concurrency: list[int],
    max_tokens: list[int],
    seed: int,
) -> Job:
    _validate(concurrency, max_tokens)
    found = workers.get_pool(state.db, pool, state.settings.worker_ttl)
    live = found.live
    if not live:
        raise Conflict(f"pool {pool!r} has no live worker to certify", code="no_live_worker")
    worker = max(live, key=lambda w: w.last_seen)
    with state.db.read() as s:
        fp = cache.fingerprint_body(s, worker.fingerprint_id)
    engine = fp.get("engine") or {}
    max_len = engine.get("max_model_len")
    max_len = max_len if isinstance(max_len, int) else DEFAULT_MAX_MODEL_LEN
    budget = max_len - max(max_tokens) - 8
    if budget < 8:
        raise InvalidInput(
            f"max_tokens {max(max_tokens)} leaves no room for a prompt within the pool's "
            f"max_model_len {max_len}",
            code="invalid_parameters",
        )
    sorted_c = sorted(set(concurrency) | {1})
    parameters = {
        "prompts": prompts,
        "concurrency": sorted_c,
        "max_tokens": sorted(set(max_tokens)),
        "seed": seed,
        "prompt_chars": budget,
        "model": _served_name(engine.get("served_model_name")),
    }
    job = Job(
        f"cert-{uuid.uuid4().hex}",
        pool,
        worker,
        parameters,
        _total(prompts, sorted_c, parameters["max_tokens"]),
    )
    _forget_old(state.jobs)
    state.jobs[job.job_id] = job
    return job


def _forget_old(jobs: dict[str, Any], keep: int = 100) -> None:
    """Keep the most recent finished jobs (their certificates stay in the log)."""
    finished = [k for k, j in jobs.items() if isinstance(j, Job) and j.status != "running"]
    for key in finished[: max(0, len(finished) - keep)]:
        del jobs[key]


def _served_name(value: Any) -> str | None:
    if isinstance(value, list) and value and isinstance(value[0], str):
        return value[0]
    return value if isinstance(value, str) else None


def get(state: AppState, job_id: str) -> Job:
    job = state.jobs.get(job_id)
    if not isinstance(job, Job):
        raise NotFound(
            f"no certification {job_id!r} (jobs are kept in memory)", code="job_not_found"
        )
    return job


async def run(state: AppState, job: Job) -> None:
    try:
        await _run(state, job)
        job.status = "done"
    except LedgerError as exc:
        job.status, job.error = "failed", exc.to_dict()
    except Exception as exc:  # a job must end in a state the client can read
        logger.exception("certification %s failed", job.job_id)
        job.status, job.error = "failed", {"code": "internal_error", "message": repr(exc)}


async def _probe(state: AppState, job: Job, body: dict[str, Any], n: int) -> Generation:
    raw = json.dumps(body, separators=(",", ":")).encode()
    answer: WorkerAnswer = await run_order(
        state.workers_http,
        state.db,
        state.log_key,
        job.worker,
        replay_id=f"{job.job_id[:30]}-{n}",
        request_id=f"{job.job_id}-probe-{n}",
        endpoint="/v1/completions",
        request_raw=raw,
    )
    if answer.body["fingerprint_id"] != job.worker.fingerprint_id:
        raise Conflict(
            "the worker's fingerprint changed during certification", code="fingerprint_changed"
        )
    job.done += 1
    return output_generation(answer.body)


async def _run(state: AppState, job: Job) -> None:
    p = job.parameters
    probes = certify.probe_prompts(p["prompts"], p["seed"], p["prompt_chars"])
    counter = iter(range(1_000_000))
    results = []
    for m in p["max_tokens"]:
        bodies = [certify.probe_request(pr, m, p["model"]) for pr in probes]
        baseline = [await _probe(state, job, b, next(counter)) for b in bodies]
        for c in p["concurrency"]:
            comparisons: list[Comparison] = []
            if c == 1:
                for i, b in enumerate(bodies):
                    again = await _probe(state, job, b, next(counter))
                    comparisons.append(compare(baseline[i], again))
            else:
                order = [i % len(bodies) for i in range(_wave_size(len(bodies), c))]
                for start in range(0, len(order), c):
                    wave = order[start : start + c]
                    outs = await asyncio.gather(
                        *(_probe(state, job, bodies[i], next(counter)) for i in wave)
                    )
                    comparisons.extend(
                        compare(baseline[i], out) for i, out in zip(wave, outs, strict=True)
                    )
            results.append(certify.cell(m, c, comparisons, baseline))
    body = certify.certificate(
        certificate_id=job.job_id,
        pool=job.pool,
        worker_id=job.worker.worker_id,
        fingerprint_id=job.worker.fingerprint_id,
        batch_invariance=job.worker.batch_invariance,
        parameters=p,
        results=results,
    )
    job.certificate = await run_in_threadpool(
        verdicts.append_certificate, state.db, state.log_key, body
    )
