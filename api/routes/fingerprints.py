from __future__ import annotations

import json

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from api.auth import ReadRecords, WriteRecords
from api.body import read_json
from api.schemas import ENVELOPE_SCHEMA, ERRORS, FingerprintCreated, repeated
from api.state import StateDep
from ledger.storage import ingest

router = APIRouter(prefix="/v1/fingerprints", tags=["fingerprints"], responses=ERRORS)


@router.post(
    "",
    response_model=FingerprintCreated,
    status_code=201,
    responses=repeated("the same fingerprint registered again"),
    summary="Register a signed fingerprint envelope",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ENVELOPE_SCHEMA}},
        }
    },
)
async def register_fingerprint(
    request: Request, state: StateDep, _: WriteRecords, response: Response
) -> dict[str, object]:
    data = await read_json(request, state.settings.max_body_bytes)
    result = await run_in_threadpool(ingest.add_fingerprint, state.db, data)
    if result.status == "duplicate":
        response.status_code = 200
    return {
        "fingerprint_id": result.fingerprint_id,
        "status": result.status,
        "log_index": result.log_index,
    }


@router.get("/{fingerprint_id}", summary="A fingerprint and its signed envelope")
async def get_fingerprint(fingerprint_id: str, state: StateDep, _: ReadRecords) -> Response:
    fp = await run_in_threadpool(ingest.get_fingerprint, state.db, fingerprint_id)
    meta = json.dumps(
        {
            "fingerprint_id": fp.fingerprint_id,
            "log_index": fp.log_index,
            "registered_at": fp.registered_at,
        }
    ).encode()
    # The stored canonical envelope is spliced in unchanged: same bytes as were signed.
    return Response(meta[:-1] + b',"envelope":' + fp.envelope + b"}", media_type="application/json")
