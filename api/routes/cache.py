"""Cache keys (algorithm ck1, see ledger/cachekey.py) and recorded outputs by key."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from api.auth import ReadCache
from api.body import body_doc, json_body
from api.routes.records import render_record
from api.schemas import ERRORS, CacheKeyRequest, CacheLookupRequest
from api.state import AppState, StateDep
from ledger.cache_answer import sse
from ledger.cachekey import ALGORITHM
from ledger.compact_json import compact_json
from ledger.errors import InvalidInput
from ledger.storage import cache
from ledger.storage.cache_lookup import Answer, answer

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


def _lookup(state: AppState, payload: CacheLookupRequest) -> tuple[Answer, dict[str, Any]]:
    if (payload.pool is None) == (payload.fingerprint_id is None):
        raise InvalidInput(
            "name a pool or a fingerprint_id (one of them)", code="invalid_parameters"
        )
    context: dict[str, Any] = {"pool": payload.pool}
    fingerprint_id = payload.fingerprint_id
    if payload.pool is not None:
        contract = state.pool_contracts.resolve(state.db, payload.pool, state.settings.worker_ttl)
        fingerprint_id = contract.fingerprint_id
        context["pool_fingerprint_ids"] = list(contract.fingerprint_ids)
    assert fingerprint_id is not None
    found = answer(
        state.db,
        payload.endpoint,
        payload.request,
        fingerprint_id,
        prompt_token_ids=payload.prompt_token_ids,
        hot=state.hot_answers,
        pool=payload.pool,
    )
    return found, context


@router.post(
    "/lookup",
    summary="A request's recorded answer, in one call",
    responses={
        200: {
            "description": "a hit or a miss; a streamed request's hit as server-sent events",
            "content": {"application/json": {}, "text/event-stream": {}},
        }
    },
    description="Keys the request (`ck1`) under the fingerprint of the named pool's live workers "
    "(the one most of them serve; `pool_fingerprint_ids` lists all) or under `fingerprint_id`, "
    'and answers `{"hit": true, "response"}` with vLLM\'s answer rebuilt from the '
    "earliest reusable record (re-derived from its log entry; by pool, the earliest recorded "
    "in that pool), with `request_id`, `log_index` "
    'and `fingerprint_id` for the evidence; or `{"hit": false, "reason", "message"}` '
    "(`not_deterministic`, `no_record`, `fingerprint_changed`, `not_reusable`, "
    "`not_servable`). A streamed request's hit is `text/event-stream`, the evidence in "
    "`Ledger-*` headers. Scope `cache:read` (or `records:read`).",
    openapi_extra=body_doc(CacheLookupRequest),
)
async def lookup_request(
    _: ReadCache,
    payload: Annotated[CacheLookupRequest, json_body(CacheLookupRequest)],
    state: StateDep,
) -> Response:
    found, context = await run_in_threadpool(_lookup, state, payload)
    state.metrics.cache_lookups.labels(found.outcome, found.via).inc()
    return render_answer(found, context, payload)


def render_answer(found: Answer, context: dict[str, Any], payload: CacheLookupRequest) -> Response:
    """A lookup's answer: JSON, or a streamed request's hit as server-sent events."""
    head: dict[str, Any] = {
        "hit": found.hit,
        "key": found.key,
        "fingerprint_id": found.fingerprint_id,
        **context,
    }
    if found.record is None:
        body = {**head, "reason": found.reason, "message": found.message}
        return Response(compact_json(body), media_type="application/json")
    assert found.response is not None
    evidence = {"request_id": found.record.request_id, "log_index": found.record.log_index}
    if payload.request.get("stream") is True:
        headers = {
            "Ledger-Cache": "hit",
            "Ledger-Cache-Key": found.key,
            "Ledger-Fingerprint-Id": found.fingerprint_id,
            "Ledger-Request-Id": found.record.request_id,
            "Ledger-Log-Index": str(found.record.log_index),
        }
        events = sse(payload.endpoint, payload.request, found.response)
        return Response(events, media_type="text/event-stream", headers=headers)
    body = {**head, **evidence, "response": found.response}
    return Response(compact_json(body), media_type="application/json")


@router.get(
    "/{key}",
    summary="The recorded output for a cache key",
    description="Answers the earliest record in log order under the key that, as logged, is "
    "at tier >= 1 with deterministic sampling (temperature 0, or a seed other than -1) and not "
    "aborted; 404 `cache_miss` otherwise. The record is re-derived from its envelope first "
    "(its keys recomputed): an index row that disagrees with the log is 500 `index_mismatch`, "
    "never an answer. Scope `cache:read` (or `records:read`).",
)
async def lookup(key: str, state: StateDep, _: ReadCache) -> Response:
    hit = await run_in_threadpool(cache.lookup, state.db, key)
    return Response(render_record(hit.record, key=hit.key), media_type="application/json")
