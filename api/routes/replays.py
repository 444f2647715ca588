"""Replays: re-run a recorded request on a matching batch-invariant worker, log the verdict."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from api import replayer
from api.auth import ReadRecords, ReplayScope
from api.body import body_doc, json_body
from api.schemas import ERRORS, UPSTREAM_ERRORS, ReplayCreate
from api.state import StateDep
from ledger.storage import verdicts

router = APIRouter(prefix="/v1/replays", tags=["replays"], responses={**ERRORS, **UPSTREAM_ERRORS})


@router.post(
    "",
    status_code=201,
    summary="Replay a recorded request and log a signed verdict",
    description="Verdicts: bitwise, tokens_match_logprobs_drift, diverged, prompt_mismatch, "
    "not_comparable (forced onto a pool that does not match; the comparison is reported), "
    "error (the worker did not answer). 409 no_matching_pool lists the nearest pools with "
    "their fingerprint differences.",
    openapi_extra=body_doc(ReplayCreate),
)
async def create_replay(
    _: ReplayScope, payload: Annotated[ReplayCreate, json_body(ReplayCreate)], state: StateDep
) -> Response:
    stored = await replayer.replay(state, payload.request_id, payload.pool, payload.force)
    return Response(stored.render("replay_id"), 201, media_type="application/json")


@router.get("/{replay_id}", summary="A replay verdict and its signed envelope")
async def get_replay(replay_id: str, state: StateDep, _: ReadRecords) -> Response:
    stored = await run_in_threadpool(verdicts.get_verdict, state.db, replay_id)
    return Response(stored.render("replay_id"), media_type="application/json")
