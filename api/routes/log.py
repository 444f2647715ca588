"""The transparency log: checkpoints, inclusion and consistency proofs, the log key."""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from starlette.concurrency import run_in_threadpool

from api.auth import Admin, ReadRecords
from api.schemas import ERRORS
from api.state import StateDep
from ledger.clock import rfc3339
from ledger.errors import NotFound
from ledger.signing import public_key_pem
from ledger.storage import checkpoints, proofs

router = APIRouter(prefix="/v1/log", tags=["log"], responses=ERRORS)
# Leaf indexes and tree sizes are SQL bigints: a larger one names no leaf (422, not a 500).
MAX_SIZE = 2**63 - 1


def _checkpoint(cp: checkpoints.StoredCheckpoint, origin: str) -> dict[str, Any]:
    return {
        "origin": origin,
        "tree_size": cp.tree_size,
        "root_hash": base64.b64encode(cp.root_hash).decode(),
        "signed_at": rfc3339(cp.signed_at),
        "note": cp.note,
    }


@router.get("/checkpoint", summary="The latest signed checkpoint (C2SP tlog-checkpoint)")
async def get_checkpoint(state: StateDep, _: ReadRecords) -> dict[str, Any]:
    cp = await run_in_threadpool(checkpoints.latest, state.db)
    return _checkpoint(cp, state.origin)


@router.post("/checkpoint", summary="Sign a checkpoint now if the log has grown")
async def sign_checkpoint(state: StateDep, _: Admin) -> dict[str, Any]:
    cp = await run_in_threadpool(checkpoints.sign_if_new, state.db, state.log_key, state.origin)
    if cp is None:
        raise NotFound("the log is empty", code="no_checkpoint")
    return _checkpoint(cp, state.origin)


@router.get("/proof/inclusion", summary="RFC 9162 inclusion proof of a leaf")
async def inclusion(
    state: StateDep,
    _: ReadRecords,
    index: Annotated[int, Query(ge=0, le=MAX_SIZE)],
    tree_size: Annotated[int, Query(ge=1, le=MAX_SIZE)],
) -> Response:
    proof = await run_in_threadpool(proofs.inclusion, state.db, index, tree_size)
    return Response(json.dumps(proof).encode(), media_type="application/json")


@router.get("/proof/consistency", summary="RFC 9162 consistency proof between two tree sizes")
async def consistency(
    state: StateDep,
    _: ReadRecords,
    first: Annotated[int, Query(ge=0, le=MAX_SIZE)],
    second: Annotated[int, Query(ge=0, le=MAX_SIZE)],
) -> Response:
    proof = await run_in_threadpool(proofs.consistency, state.db, first, second)
    return Response(json.dumps(proof).encode(), media_type="application/json")


@router.get("/key", summary="The log's public key (pin it out of band for verification)")
async def log_key(state: StateDep) -> dict[str, Any]:
    return {
        **proofs.log_key_entry(state.log_key, state.origin),
        "pem": public_key_pem(state.log_key.public_key),
    }
