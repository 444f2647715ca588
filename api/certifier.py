"""Certification jobs: run the replay matrix (``ledger.certify``) on a pool's worker.

A job's state lives in the database (``ledger.storage.certification_jobs``), so every API
process answers ``GET /v1/certifications/{id}``: progress, and when done the signed
certificate (a log leaf). The process that accepted the job runs it as an asyncio task and
holds its lease: a heartbeat writes the progress every ``FLUSH_EVERY`` seconds when it moved,
and renews the lease at least every ``RENEW_EVERY``. A process that dies leaves its jobs to
expire ``LEASE`` after the last renewal; the next process to read one (or any process
starting) fails it with ``interrupted``. A process that shuts down fails its running jobs
with ``interrupted`` at once. Jobs are not resumed (see the storage module for why).

Every probe goes through the replay channel (a log-key-signed order to the worker's
collector), so probes are never recorded as traffic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Coroutine
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from starlette.concurrency import run_in_threadpool

from api.state import AppState
from api.workers_client import WorkerAnswer, run_order
from ledger import certify
from ledger.clock import rfc3339
from ledger.compact_json import compact_json
from ledger.compare import Comparison, Generation, compare
from ledger.errors import Conflict, InvalidInput, LedgerError
from ledger.replay import output_generation
from ledger.storage import cache, certification_jobs, queries, workers
from ledger.storage.certification_jobs import INTERRUPTED, Job
from ledger.storage.workers import WorkerInfo
from ledger.tokens import Principal

logger = logging.getLogger("ledger.certify")
DEFAULT_MAX_MODEL_LEN = 2048
LEASE = timedelta(seconds=15)
RENEW_EVERY = 3.0
FLUSH_EVERY = 0.5
_JOB_ID = re.compile(r"^cert-[0-9a-f]{32}$")


@dataclass
class Run:
    """A job this process runs: the worker it probes and its progress, in memory."""

    job: Job  # the row as created
    worker: WorkerInfo
    done: int = 0
    # Held so the running task is not garbage-collected (the loop keeps only a weak reference).
    task: asyncio.Task[None] | None = None

    @property
    def job_id(self) -> str:
        return self.job.certification_id


def to_dict(job: Job) -> dict[str, Any]:
    out: dict[str, Any] = {
        "certification_id": job.certification_id,
        "pool": job.pool,
        "worker_id": job.worker_id,
        "fingerprint_id": job.fingerprint_id,
        "status": job.state,
        "done": job.done,
        "total": job.total,
        "parameters": job.parameters,
        "error": job.error,
        "created_at": rfc3339(job.created_at),
        "updated_at": rfc3339(job.updated_at),
    }
    if job.certificate is not None:
        out["certificate_id"] = job.certificate_id
        out["log_index"] = job.log_index
        out["envelope"] = json.loads(job.certificate)
    return out


def _validate(concurrency: list[int], max_tokens: list[int]) -> None:
    if any(not 1 <= c <= certify.MAX_CONCURRENCY for c in concurrency):
        raise InvalidInput(
            f"concurrency values must be 1..{certify.MAX_CONCURRENCY}", code="invalid_parameters"
        )
    if any(not 1 <= m <= certify.MAX_TOKENS for m in max_tokens):
        raise InvalidInput(
            f"max_tokens values must be 1..{certify.MAX_TOKENS}", code="invalid_parameters"
        )


def start(
    state: AppState,
    pool: str,
    prompts: int,
    concurrency: list[int],
    max_tokens: list[int],
    seed: int,
    started_by: str | None = None,
) -> Run:
    """Check the request, choose the worker and write the job, running, leased to this
    process (blocking: call it in a thread); :func:`launch` then runs it."""
    _validate(concurrency, max_tokens)
    found = workers.get_pool(state.db, pool, state.settings.worker_ttl)
    live = found.live
    if not live:
        raise Conflict(f"pool {pool!r} has no live worker to certify", code="no_live_worker")
    worker = max(live, key=lambda w: w.last_seen)
    with state.db.read() as s:
        fp = cache.fingerprint_body(s, worker.fingerprint_id)
    engine = fp.get("engine")
    engine = engine if isinstance(engine, dict) else {}  # what the collector signed, any shape
    max_len = engine.get("max_model_len")
    max_len = max_len if type(max_len) is int and max_len > 0 else DEFAULT_MAX_MODEL_LEN
    budget = max_len - max(max_tokens) - 8
    if budget < 8:
        raise InvalidInput(
            f"max_tokens {max(max_tokens)} leaves no room for a prompt within the pool's "
            f"max_model_len {max_len}",
            code="invalid_parameters",
        )
    sorted_c = sorted(set(concurrency) | {1})
    sorted_m = sorted(set(max_tokens))
    parameters: dict[str, Any] = {
        "prompts": prompts,
        "concurrency": sorted_c,
        "max_tokens": sorted_m,
        "seed": seed,
        "prompt_chars": min(budget, certify.MAX_PROMPT_CHARS),
        "model": _served_name(engine.get("served_model_name")),
    }
    total = certify.probe_count(parameters)
    if total > certify.MAX_PROBES:
        raise InvalidInput(
            f"this certification would send {total} probes, more than {certify.MAX_PROBES}: "
            "ask for fewer prompts, concurrency or max_tokens values",
            code="invalid_parameters",
            details={"probes": total, "max_probes": certify.MAX_PROBES},
        )
    job = certification_jobs.create(
        state.db,
        certification_id=f"cert-{uuid.uuid4().hex}",
        pool=pool,
        worker_id=worker.worker_id,
        fingerprint_id=worker.fingerprint_id,
        parameters=parameters,
        total=total,
        runner=state.runner_id,
        lease=LEASE,
        started_by=started_by,
    )
    return Run(job, worker)


def launch(state: AppState, run: Run) -> dict[str, Any]:
    """Run the job in this process's event loop; what POST answers."""
    state.jobs[run.job_id] = run
    run.task = asyncio.create_task(_run_job(state, run), name=run.job_id)
    return to_dict(run.job)


def _served_name(value: Any) -> str | None:
    if isinstance(value, list) and value and isinstance(value[0], str):
        return value[0]
    return value if isinstance(value, str) else None


def get(state: AppState, job_id: str) -> dict[str, Any]:
    """A job as the database has it, whichever process runs it (blocking)."""
    queries.check_name(job_id, _JOB_ID, "a certification ID is cert- and 32 hex digits")
    return to_dict(certification_jobs.get(state.db, job_id))


def cancel(state: AppState, job_id: str, by: Principal) -> dict[str, Any]:
    """Cancel a running job, whichever process runs it, for the token that started it or an
    admin token (blocking)."""
    queries.check_name(job_id, _JOB_ID, "a certification ID is cert- and 32 hex digits")
    return to_dict(certification_jobs.cancel(state.db, job_id, by))


def sweep(state: AppState) -> None:
    """At start-up: fail the jobs of processes that died (their leases ran out)."""
    try:
        failed = certification_jobs.expire(state.db)
    except LedgerError as exc:  # a later read of each job fails it all the same
        logger.warning("certification jobs not swept: %s", exc.message)
        return
    if failed:
        logger.warning("certifications interrupted by a stopped process: %s", failed)


async def shutdown(state: AppState) -> None:
    """Stop this process's jobs and fail them now, rather than when their leases run out."""
    runs = [r for r in state.jobs.values() if isinstance(r, Run) and r.task is not None]
    for r in runs:
        assert r.task is not None
        r.task.cancel()
    if runs:
        await asyncio.wait([r.task for r in runs if r.task is not None], timeout=10)
    for r in runs:
        error = {
            "code": INTERRUPTED,
            "message": "the ledger process running it shut down; start a new certification",
            "details": {"runner": state.runner_id, "done": r.done, "total": r.job.total},
        }
        try:
            await run_in_threadpool(
                certification_jobs.finish,
                state.db,
                r.job_id,
                state.runner_id,
                done=r.done,
                error=error,
            )
        except LedgerError as exc:  # its lease runs out instead
            logger.warning("certification %s not marked interrupted: %s", r.job_id, exc.message)


async def _run_job(state: AppState, run: Run) -> None:
    beat = asyncio.create_task(_heartbeat(state, run))
    try:
        body = await _probes(state, run)
        # Append and record under one thread call, shielded: once the certificate is being
        # logged, a cancellation (shutdown, lost lease) no longer separates the two.
        await asyncio.shield(run_in_threadpool(_conclude, state, run, body))
    except LedgerError as exc:
        await _fail(state, run, exc.to_dict())
    except Exception as exc:  # a job must end in a state the client can read
        logger.exception("certification %s failed", run.job_id)
        await _fail(state, run, {"code": "internal_error", "message": repr(exc)})
    finally:
        beat.cancel()
        with suppress(asyncio.CancelledError):
            await beat
        state.jobs.pop(run.job_id, None)


def _conclude(state: AppState, run: Run, body: dict[str, Any]) -> None:
    db, runner = state.db, state.runner_id
    if not certification_jobs.renew(db, run.job_id, runner, done=run.done, lease=LEASE):
        logger.warning("certification %s lost its lease before logging", run.job_id)
        return
    certification_jobs.conclude(
        db, state.log_key, run.job_id, runner, done=run.done, certificate=body
    )


async def _fail(state: AppState, run: Run, error: dict[str, Any]) -> None:
    try:
        await run_in_threadpool(
            certification_jobs.finish,
            state.db,
            run.job_id,
            state.runner_id,
            done=run.done,
            error=error,
        )
    except LedgerError as exc:  # its lease runs out instead, and it fails as interrupted
        logger.warning("certification %s: failure not recorded: %s", run.job_id, exc.message)


async def _heartbeat(state: AppState, run: Run) -> None:
    """Write progress when it moved and renew the lease; stop the job if it was lost."""
    written, renewed = 0, time.monotonic()
    while True:
        await asyncio.sleep(FLUSH_EVERY)
        if run.done == written and time.monotonic() - renewed < RENEW_EVERY:
            continue
        done = run.done
        try:
            held = await run_in_threadpool(
                certification_jobs.renew,
                state.db,
                run.job_id,
                state.runner_id,
                done=done,
                lease=LEASE,
            )
        except LedgerError as exc:  # the database may be briefly away: retry next tick
            logger.warning("certification %s: lease not renewed: %s", run.job_id, exc.message)
            continue
        if not held:
            logger.warning("certification %s: this process lost its lease; stopping", run.job_id)
            with suppress(LedgerError):
                await run_in_threadpool(certification_jobs.expire, state.db, only=run.job_id)
            if run.task is not None:
                run.task.cancel()
            return
        written, renewed = done, time.monotonic()


async def _probe(state: AppState, run: Run, body: dict[str, Any], n: int) -> Generation:
    raw = compact_json(body)
    answer: WorkerAnswer = await run_order(
        state.workers_http,
        state.db,
        state.log_key,
        run.worker,
        replay_id=f"{run.job_id[:30]}-{n}",
        request_id=f"{run.job_id}-probe-{n}",
        endpoint="/v1/completions",
        request_raw=raw,
        deadline=state.settings.replay_timeout,
        max_bytes=state.settings.max_body_bytes,
    )
    if answer.body["fingerprint_id"] != run.worker.fingerprint_id:
        raise Conflict(
            "the worker's fingerprint changed during certification", code="fingerprint_changed"
        )
    run.done += 1
    return output_generation(answer.body)


async def _wave(probes: list[Coroutine[Any, Any, Generation]]) -> list[Generation]:
    """Run one wave's probes at once; the first that fails fails the wave, and the others
    are cancelled then, not left holding their workers' connections."""
    tasks = [asyncio.ensure_future(p) for p in probes]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _probes(state: AppState, run: Run) -> dict[str, Any]:
    """Run the matrix; the certificate body."""
    p = run.job.parameters
    probes = await run_in_threadpool(
        certify.probe_prompts, p["prompts"], p["seed"], p["prompt_chars"]
    )
    counter = iter(range(1_000_000))
    results = []
    for m in p["max_tokens"]:
        bodies = [certify.probe_request(pr, m, p["model"]) for pr in probes]
        baseline = [await _probe(state, run, b, next(counter)) for b in bodies]
        for c in p["concurrency"]:
            comparisons: list[Comparison] = []
            if c == 1:
                for i, b in enumerate(bodies):
                    again = await _probe(state, run, b, next(counter))
                    comparisons.append(compare(baseline[i], again))
            else:
                order = [i % len(bodies) for i in range(certify.wave_size(len(bodies), c))]
                for start_at in range(0, len(order), c):
                    wave = order[start_at : start_at + c]
                    outs = await _wave([_probe(state, run, bodies[i], next(counter)) for i in wave])
                    comparisons.extend(
                        compare(baseline[i], out) for i, out in zip(wave, outs, strict=True)
                    )
            results.append(certify.cell(m, c, comparisons, baseline))
    return certify.certificate(
        certificate_id=run.job_id,
        pool=run.job.pool,
        worker_id=run.worker.worker_id,
        fingerprint_id=run.worker.fingerprint_id,
        batch_invariance=run.worker.batch_invariance,
        parameters=p,
        results=results,
        started_at=rfc3339(run.job.created_at),
    )
