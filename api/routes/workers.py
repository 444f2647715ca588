"""Workers (registration and heartbeat, signed by the worker's collector key) and pools."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from api.auth import ReadRecords, WriteRecords
from api.body import read_json
from api.schemas import ENVELOPE_SCHEMA, ERRORS, WorkerHeartbeat
from api.state import StateDep
from ledger.heartbeat import HEARTBEAT_KIND
from ledger.storage import workers
from ledger.worker_url import UrlPolicy

router = APIRouter(tags=["workers"], responses=ERRORS)

# A heartbeat is a few hundred bytes; nothing bigger is read.
HEARTBEAT_MAX_BYTES = 16 * 1024
HEARTBEAT_SCHEMA: dict[str, Any] = {
    **ENVELOPE_SCHEMA,
    "properties": {
        **ENVELOPE_SCHEMA["properties"],
        "kind": {"const": HEARTBEAT_KIND},
        "body": WorkerHeartbeat.model_json_schema(),
    },
}


@router.post(
    "/v1/workers",
    summary="Register a worker or refresh its heartbeat (the same call)",
    description="A `worker_heartbeat` envelope signed by the worker's collector key "
    "(registered, unrevoked, role collector). Collectors send one at start and every few "
    "seconds; a worker is live while its last heartbeat is within LEDGER_WORKER_TTL seconds. "
    "A worker ID belongs to the first key that registered it (another key: 409 "
    "`worker_conflict`); `issued_at` must be within 60 s of the ledger's clock and later than "
    "the last accepted heartbeat (422 `stale_heartbeat`); the URL must be allowed (422 "
    "`invalid_url`, `url_not_allowed`). The answer's `batch_invariance` is derived from the "
    "fingerprint.",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": HEARTBEAT_SCHEMA}},
        }
    },
)
async def heartbeat(request: Request, state: StateDep, _: WriteRecords) -> dict[str, Any]:
    data = await read_json(request, min(HEARTBEAT_MAX_BYTES, state.settings.max_body_bytes))
    policy = UrlPolicy.parse(state.settings.worker_networks)
    info = await run_in_threadpool(
        workers.heartbeat,
        state.db,
        data,
        policy,
        max_workers=state.settings.max_workers_per_key,
    )
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
