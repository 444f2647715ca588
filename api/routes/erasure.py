"""Erasure of records' content (one, or by filter) and legal holds: each a signed log event."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from starlette.concurrency import run_in_threadpool

from api.auth import EraseScope, HoldsScope
from api.body import body_doc, json_body
from api.schemas import (
    ERRORS,
    BulkErasureCreate,
    ErasureCreate,
    HoldCreate,
    RecordFilterInput,
    repeated,
)
from api.state import StateDep
from ledger.clock import rfc3339
from ledger.erasure import check_hold_id
from ledger.errors import InvalidInput
from ledger.storage import erasures, queries

router = APIRouter(tags=["erasure"], responses=ERRORS)


def record_filter(flt: RecordFilterInput) -> queries.RecordFilter:
    out = queries.RecordFilter(
        since=queries.parse_time(flt.since, "since"),
        until=queries.parse_time(flt.until, "until"),
        model=flt.model,
        fingerprint_id=flt.fingerprint_id,
        tier=flt.tier,
        pool=flt.pool,
    )
    out.check()
    return out


@router.post(
    "/v1/records/{request_id}/erasure",
    status_code=201,
    responses=repeated("the record was already erased: `already_erased` with its event"),
    summary="Erase a record's content (its disclosures, cache keys) with a logged event",
    description="Scope `erasure`. Appends an `erasure` event signed by the log key (request "
    "ID, the digests erased, reason, the token's name, time). 409 `not_erasable` for a schema "
    "v1 record, 409 `legal_hold` for a held one; an erased record answers 200 "
    "`already_erased` with its event.",
    openapi_extra=body_doc(ErasureCreate),
)
async def erase_record(
    request_id: str,
    principal: EraseScope,
    payload: Annotated[ErasureCreate, json_body(ErasureCreate)],
    state: StateDep,
    response: Response,
) -> dict[str, Any]:
    queries.check_request_id(request_id)
    erased = await run_in_threadpool(
        lambda: state.hot_answers.after_erasure(
            lambda: erasures.erase(
                state.db,
                state.log_key,
                request_id,
                reason=payload.reason,
                requested_by=principal.name,
            ),
            lambda _: {request_id},
        )
    )
    if erased.status == "erased":
        state.metrics.erasures.labels("request").inc()
    else:
        response.status_code = 200
    return erased.to_dict()


@router.post(
    "/v1/erasures",
    summary="Erase the content of every record a search filter matches (dry run by default)",
    description="Scope `erasure`. `dry_run` (default true) lists exactly the request IDs a run "
    "would erase, and the held ones it would skip; with `dry_run: false` each is erased as by "
    "the single route, 500 per transaction. The filter names at least one member: an empty "
    "one is 422 `invalid_parameters` (it would erase every record).",
    openapi_extra=body_doc(BulkErasureCreate),
)
async def erase_matching(
    principal: EraseScope,
    payload: Annotated[BulkErasureCreate, json_body(BulkErasureCreate)],
    state: StateDep,
) -> dict[str, Any]:
    flt = record_filter(payload.filter)
    if flt == queries.RecordFilter():  # as `ledger erase` refuses it, a dry run too
        raise InvalidInput(
            "give at least one filter member (model, fingerprint_id, pool, tier, since, "
            "until): an empty filter would erase every record",
            code="invalid_parameters",
        )

    def erase() -> erasures.BulkResult:
        return erasures.erase_matching(
            state.db,
            state.log_key,
            flt,
            reason=payload.reason,
            requested_by=principal.name,
            dry_run=payload.dry_run,
        )

    if payload.dry_run:
        result = await run_in_threadpool(erase)
    else:
        result = await run_in_threadpool(
            lambda: state.hot_answers.after_erasure(erase, lambda done: set(done.erased))
        )
        state.metrics.erasures.labels("request").inc(len(result.erased))
    return result.to_dict()


@router.post(
    "/v1/holds",
    status_code=201,
    summary="Place a legal hold on a request ID or a search filter (a logged event)",
    description="Scope `holds`. While placed, no erasure (by request or retention) touches a "
    "record the hold covers.",
    openapi_extra=body_doc(HoldCreate),
)
async def place_hold(
    principal: HoldsScope,
    payload: Annotated[HoldCreate, json_body(HoldCreate)],
    state: StateDep,
) -> dict[str, Any]:
    if payload.request_id is not None:
        queries.check_request_id(payload.request_id)
    flt = None
    if payload.filter is not None:
        parsed = record_filter(payload.filter)  # refuses a malformed filter
        flt = payload.filter.model_dump(exclude_none=True)
        for name in ("since", "until"):  # as the ledger writes times
            at = getattr(parsed, name)
            if at is not None:
                flt[name] = rfc3339(at)
    return await run_in_threadpool(
        lambda: erasures.place_hold(
            state.db,
            state.log_key,
            request_id=payload.request_id,
            filter=flt,
            reason=payload.reason,
            placed_by=principal.name,
        )
    )


@router.get("/v1/holds", summary="Every legal hold, placed and released")
async def list_holds(_: HoldsScope, state: StateDep) -> dict[str, Any]:
    return {"holds": await run_in_threadpool(erasures.list_holds, state.db)}


@router.delete(
    "/v1/holds/{hold_id}",
    summary="Release a legal hold (a logged event)",
    description="Scope `holds`. `reason` (required) is logged with the release; the hold "
    "itself stays in the log.",
)
async def release_hold(
    hold_id: str,
    principal: HoldsScope,
    state: StateDep,
    reason: Annotated[str, Query(min_length=1, max_length=1000)],
) -> Response:
    check_hold_id(hold_id)
    out = await run_in_threadpool(
        lambda: erasures.release_hold(
            state.db, state.log_key, hold_id, reason=reason, released_by=principal.name
        )
    )
    return Response(json.dumps(out), media_type="application/json")
