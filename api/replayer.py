"""Replay orchestration: pick a worker, re-run the recorded request, compare, log a verdict.

A worker qualifies when it is live (a recent heartbeat, signed by its key, that still
verifies), its fingerprint ID equals the record's and the batch invariance derived from that
fingerprint is not ``none``; a replay that names no pool considers only workers whose keys
may sign for the record's pool (``ledger.key_scope``). Without one: 409
``no_matching_pool`` listing the nearest pools with the field-level fingerprint diff. With
``force`` the named pool's worker is used and the verdict is ``not_comparable`` (the
comparison is still reported) unless that worker does qualify. A worker that fails to
answer, or answers with output not signed by the key it is bound to, yields a logged
``error`` verdict. Every verdict names the worker and its key.
"""

from __future__ import annotations

import base64
from typing import Any

from starlette.concurrency import run_in_threadpool

from api.state import AppState
from api.workers_client import new_replay_id, run_order
from ledger import compare, disclosures
from ledger.cachekey import samples_at_random
from ledger.compact_json import compact_json
from ledger.errors import Conflict, InvalidInput, LedgerError, NotFound
from ledger.fingerprint_diff import diff
from ledger.key_scope import check_pool_name, may_sign_for
from ledger.replay import build_verdict, output_generation, record_generation
from ledger.storage import cache, queries, registered, verdicts, workers
from ledger.storage.database import Database
from ledger.storage.workers import WorkerInfo

MAX_DIFF_ENTRIES = 60


def _qualifies(w: WorkerInfo, fingerprint_id: str) -> bool:
    return w.live and w.fingerprint_id == fingerprint_id and w.batch_invariance != "none"


def _fp_body(db: Database, fingerprint_id: str) -> dict[str, Any]:
    with db.read() as s:
        return cache.fingerprint_body(s, fingerprint_id)


def fingerprint_diff(db: Database, a: str, b: str) -> list[dict[str, Any]]:
    return _diff(_fp_body(db, a), _fp_body(db, b))


def _diff(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Causes first (derived fields after), capped at MAX_DIFF_ENTRIES."""
    found = diff(a, b)
    found.sort(key=lambda d: d.derived)
    return [d.to_json() for d in found[:MAX_DIFF_ENTRIES]]


def nearest_pools(db: Database, live: list[WorkerInfo], fingerprint_id: str) -> list[Any]:
    recorded = _fp_body(db, fingerprint_id)  # read once, compared with each pool's
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    for w in live:
        key = (w.pool, w.fingerprint_id, w.batch_invariance)
        if key in seen:
            continue
        differences = _diff(recorded, _fp_body(db, w.fingerprint_id))
        seen[key] = {
            "pool": w.pool,
            "fingerprint_id": w.fingerprint_id,
            "batch_invariance": w.batch_invariance,
            "differences": len(differences),
            "diff": differences,
        }
    return sorted(seen.values(), key=lambda p: (p["differences"], p["pool"]))[:5]


def _trusted_for(db: Database, live: list[WorkerInfo], record_pool: str) -> list[WorkerInfo]:
    """The workers whose keys may sign for the record's pool (``ledger.key_scope``): a replay
    that names no pool sends the record's request only to them, so another pool's collector
    claiming the record's fingerprint never receives it (a requester may name its pool)."""
    keys = registered.signer_keys(db, {w.key_id for w in live})
    return [w for w in live if w.key_id in keys and may_sign_for(keys[w.key_id].pools, record_pool)]


def choose_worker(
    db: Database,
    ttl: float,
    fingerprint_id: str,
    pool: str | None,
    force: bool,
    record_pool: str,
) -> WorkerInfo:
    if force and pool is None:
        raise InvalidInput("force needs a pool to replay on", code="pool_required")
    everyone = workers.list_workers(db, ttl)
    live = [w for w in everyone if w.live]
    if pool is not None and not any(w.pool == pool for w in everyone):
        raise NotFound(f"no pool {pool!r}: no worker has registered in it", code="pool_not_found")
    in_pool = [w for w in live if pool is None or w.pool == pool]
    # the workers the request may be sent to; the nearest pools are listed from all of them
    candidates = _trusted_for(db, in_pool, record_pool) if pool is None else in_pool
    matching = [w for w in candidates if _qualifies(w, fingerprint_id)]
    if matching:
        return max(matching, key=lambda w: w.last_seen)
    if force:
        if not candidates:
            raise Conflict(f"pool {pool!r} has no live worker", code="no_live_worker")
        return max(candidates, key=lambda w: w.last_seen)
    where = f"pool {pool!r}" if pool else "any pool"
    nearest = nearest_pools(db, in_pool or live, fingerprint_id)
    listed = (
        "the nearest pools and their differences are listed (use force with a pool to "
        "replay anyway, labelled not_comparable)"
        if nearest
        else "no live worker runs anywhere to replay it on"
    )
    raise Conflict(
        f"no live batch-invariant worker in {where} runs fingerprint {fingerprint_id}; {listed}",
        code="no_matching_pool",
        details={"fingerprint_id": fingerprint_id, "nearest_pools": nearest},
    )


async def replay(
    state: AppState, request_id: str, pool: str | None, force: bool
) -> verdicts.Stored:
    db = state.db
    if pool is not None:
        check_pool_name(pool)  # a name no pool can have: as on every other route
    record = await run_in_threadpool(queries.get_record, db, request_id)
    typed = record.record
    body = typed.content_view()  # Gone (410 content_erased) once the content was erased
    worker = await run_in_threadpool(
        choose_worker,
        db,
        state.settings.worker_ttl,
        record.fingerprint_id,
        pool,
        force,
        record.pool,
    )
    replay_id = new_replay_id()
    raw = (
        base64.b64decode(body["request_raw"])
        if "request_raw" in body
        # a record without its raw bytes: the parsed request, compact (as vLLM's clients send)
        else compact_json(body["request"])
    )
    verdict_args: dict[str, Any] = {
        "replay_id": replay_id,
        "request_id": request_id,
        "record": {
            "log_index": record.log_index,
            "content_hash": record.content_hash,
            "fingerprint_id": record.fingerprint_id,
        },
        "pool": worker.pool,
        "worker_id": worker.worker_id,
        "worker_key_id": worker.key_id,
        "forced": force,
    }
    try:
        answer = await run_order(
            state.workers_http,
            db,
            state.log_key,
            worker,
            replay_id=replay_id,
            request_id=request_id,
            endpoint=body["endpoint"],
            request_raw=raw,
            deadline=state.settings.replay_timeout,
            max_bytes=state.settings.max_body_bytes,
        )
    except LedgerError as exc:
        verdict = build_verdict(
            **verdict_args,
            worker_fingerprint_id=worker.fingerprint_id,
            verdict=compare.ERROR,
            reason=f"{exc.code}: {exc.message}",
            comparison=None,
            fingerprint_diff=None,
            output=None,
        )
        return await _log(state, verdict)
    produced_under = answer.body["fingerprint_id"]
    recorded = record_generation(body)
    result = compare.compare(recorded, output_generation(answer.body), cut=record.aborted)
    # cut before its first output token: nothing the replay could reproduce or contradict
    empty = record.aborted and not any(c.token_ids for c in recorded.choices)
    # What decides comparability is what the worker ran under, not what it registered: the
    # invariance derived from that fingerprint (ledger.heartbeat.batch_invariance).
    invariance = "none"
    if produced_under == record.fingerprint_id:
        invariance = await run_in_threadpool(workers.fingerprint_invariance, db, produced_under)
    comparable = produced_under == record.fingerprint_id and invariance != "none"
    differences = None
    reason = None
    if produced_under != record.fingerprint_id:
        reason = f"replayed under fingerprint {produced_under}, recorded under another"
        try:
            differences = await run_in_threadpool(
                fingerprint_diff, db, record.fingerprint_id, produced_under
            )
        except NotFound:
            reason += " that the ledger does not hold yet (no field-level diff)"
    elif not comparable:
        reason = f"fingerprint {produced_under} is not batch-invariant ({invariance})"
    elif samples_at_random(typed.sampling):
        reason = "the recorded request samples without a seed: a difference is expected"
    if empty:
        cut = "the record was cut before its first output token (aborted): nothing to compare"
        reason = cut if reason is None else f"{reason}; {cut}"
    elif record.aborted:
        cut = "the record was cut mid-answer (aborted): only its recorded tokens are compared"
        reason = cut if reason is None else f"{reason}; {cut}"
    # The output repeats the record's content: for an erasable record it is committed, not
    # embedded, and stored apart so that an erasure removes it too.
    kept = disclosures.make("replay_output", answer.output) if typed.erasable else None
    verdict = build_verdict(
        **verdict_args,
        worker_fingerprint_id=produced_under,
        verdict=result.verdict if comparable and not empty else compare.NOT_COMPARABLE,
        reason=reason,
        comparison=result.to_dict(),
        fingerprint_diff=differences,
        output=None if kept is not None else answer.output,
        output_digest=kept.digest if kept is not None else None,
    )
    return await _log(state, verdict, [kept.encoded] if kept is not None else [])


async def _log(
    state: AppState, verdict: dict[str, Any], content: list[str] | None = None
) -> verdicts.Stored:
    stored = await run_in_threadpool(
        verdicts.append_verdict, state.db, state.log_key, verdict, content or []
    )
    state.metrics.replays.labels(verdict["verdict"]).inc()
    return stored
