"""Cache keys (algorithm ck1, see ledger/cachekey.py) and recorded outputs by key."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from api.auth import ReadCache
from api.body import body_doc, json_body
from api.routes.records import render_record
from api.schemas import ERRORS, CacheKeyRequest
from api.state import StateDep
from ledger.cachekey import ALGORITHM
from ledger.storage import cache

router = APIRouter(prefix="/v1/cache", tags=["cache"], responses=ERRORS)


@router.post(
    "/key",
    summary="The cache key of a request under a registered fingerprint",
    description="Scope `cache:read` (or `records:read`).",
    openapi_extra=body_doc(CacheKeyRequest),
)
async def make_key(
    _: ReadCache,
    payload: Annotated[CacheKeyRequest, json_body(CacheKeyRequest)],
    state: StateDep,
) -> dict[str, Any]:
    key = await run_in_threadpool(
        cache.key_for_request,
        state.db,
        payload.endpoint,
        payload.request,
        payload.fingerprint_id,
        payload.prompt_token_ids,
    )
    return {"key": key, "algorithm": ALGORITHM, "fingerprint_id": payload.fingerprint_id}


@router.get(
    "/{key}",
    summary="The recorded output for a cache key",
    description="Answers the earliest record in log order under the key that, as logged, is "
    "at tier >= 1 with deterministic sampling (temperature 0 or a seed) and not aborted; 404 "
    "`cache_miss` otherwise. The record is re-derived from its envelope first (its keys "
    "recomputed): an index row that disagrees with the log is 500 `index_mismatch`, never an "
    "answer. Scope `cache:read` (or `records:read`).",
)
async def lookup(key: str, state: StateDep, _: ReadCache) -> Response:
    hit = await run_in_threadpool(cache.lookup, state.db, key)
    return Response(render_record(hit.record, key=hit.key), media_type="application/json")
