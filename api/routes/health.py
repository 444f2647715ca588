from __future__ import annotations

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from api.schemas import ErrorResponse
from api.state import StateDep

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    summary="Liveness and database reachability",
    responses={503: {"model": ErrorResponse, "description": "the database cannot be reached"}},
)
async def healthz(state: StateDep) -> dict[str, str]:
    await run_in_threadpool(state.db.ping)
    return {"status": "ok", "database": state.db.dialect, "log_key_id": state.log_key.key_id}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(state: StateDep) -> Response:
    return await run_in_threadpool(state.metrics.render)
