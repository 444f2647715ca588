"""Pool certification jobs (the replay matrix) and the signed certificates they log."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from api import certifier
from api.auth import ReadRecords, ReplayScope
from api.body import body_doc, json_body
from api.schemas import ERRORS, UPSTREAM_ERRORS, CertifyCreate
from api.state import StateDep
from ledger.storage import verdicts

router = APIRouter(tags=["certifications"], responses={**ERRORS, **UPSTREAM_ERRORS})


@router.post(
    "/v1/certifications",
    status_code=202,
    summary="Start certifying a pool (runs in the background; poll for progress)",
    description="Probe prompts of short, medium and near-limit length run alone and in "
    "concurrent waves of mixed lengths on one live worker of the pool; every result is "
    "compared bitwise with its prompt's run alone. The signed certificate is logged when done.",
    openapi_extra=body_doc(CertifyCreate),
)
async def start(
    principal: ReplayScope,
    payload: Annotated[CertifyCreate, json_body(CertifyCreate)],
    state: StateDep,
) -> dict[str, Any]:
    run = await run_in_threadpool(
        certifier.start,
        state,
        payload.pool,
        payload.prompts,
        payload.concurrency,
        payload.max_tokens,
        payload.seed,
        principal.token_id,
    )
    return certifier.launch(state, run)


@router.get("/v1/certifications/{certification_id}", summary="Progress and result of a job")
async def status(certification_id: str, state: StateDep, _: ReadRecords) -> dict[str, Any]:
    return await run_in_threadpool(certifier.get, state, certification_id)


@router.post(
    "/v1/certifications/{certification_id}/cancel",
    summary="Cancel a running job (it fails as cancelled; no certificate is logged)",
    description="Frees the pool for another certification at once; the process running the "
    "job stops its probes within seconds. 409 `job_finished` when the job had already ended "
    "(a job already logging its certificate finishes). Scope `replay`: the token that started "
    "the job, or an admin token (403 `not_job_starter` for another).",
)
async def cancel(certification_id: str, state: StateDep, principal: ReplayScope) -> dict[str, Any]:
    return await run_in_threadpool(certifier.cancel, state, certification_id, principal)


@router.get("/v1/certificates/{certificate_id}", summary="A logged pool certificate")
async def certificate(certificate_id: str, state: StateDep, _: ReadRecords) -> Response:
    stored = await run_in_threadpool(verdicts.get_certificate, state.db, certificate_id)
    return Response(stored.render("certificate_id"), media_type="application/json")
