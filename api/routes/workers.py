"""Workers (registration and heartbeat) and the pools they form."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from api.auth import ReadRecords, WriteRecords
from api.schemas import ERRORS, WorkerHeartbeat
from api.state import StateDep
from ledger.storage import workers

router = APIRouter(tags=["workers"], responses=ERRORS)


@router.post(
    "/v1/workers",
    summary="Register a worker or refresh its heartbeat (the same call)",
    description="Collectors call this at start and every few seconds. A worker is live while "
    "its last heartbeat is within LEDGER_WORKER_TTL seconds.",
)
async def heartbeat(payload: WorkerHeartbeat, state: StateDep, _: WriteRecords) -> dict[str, Any]:
    info = await run_in_threadpool(workers.heartbeat, state.db, payload.model_dump())
    return info.to_dict()


@router.get("/v1/workers", summary="Registered workers, live or not")
async def list_workers(state: StateDep, _: ReadRecords) -> dict[str, Any]:
    items = await run_in_threadpool(workers.list_workers, state.db, state.settings.worker_ttl)
    return {"items": [w.to_dict() for w in items]}


@router.get("/v1/pools", summary="Pools: their fingerprints, live workers and invariance mode")
async def list_pools(state: StateDep, _: ReadRecords) -> dict[str, Any]:
    pools = await run_in_threadpool(workers.pools, state.db, state.settings.worker_ttl)
    return {"items": [p.to_dict() for p in pools]}


@router.get("/v1/pools/{pool}", summary="One pool")
async def get_pool(pool: str, state: StateDep, _: ReadRecords) -> dict[str, Any]:
    found = await run_in_threadpool(workers.get_pool, state.db, pool, state.settings.worker_ttl)
    return found.to_dict()
