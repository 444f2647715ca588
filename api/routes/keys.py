from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from api.auth import Admin, ReadRecords
from api.body import body_doc, json_body
from api.schemas import ERRORS, KeyCreate, KeyList, KeyPublic, KeyRevoke, repeated
from api.state import StateDep
from ledger.storage import keystore

router = APIRouter(prefix="/v1/keys", tags=["keys"], responses=ERRORS)


@router.post(
    "",
    response_model=KeyPublic,
    status_code=201,
    responses=repeated("the same key registered again: its registration as it stands"),
    summary="Register a signing key",
    description=(
        "An all-zero or other small-order Ed25519 point is refused: 422 `weak_public_key`. "
        "`pools` scopes a collector key: records and heartbeats it signs for another pool are "
        "refused (422 `key_out_of_scope`). A key's registration cannot change: the same key "
        "with another name, role or pools is 409 `key_conflict`."
    ),
    openapi_extra=body_doc(KeyCreate),
)
async def register_key(
    _: Admin,
    payload: Annotated[KeyCreate, json_body(KeyCreate)],
    state: StateDep,
    response: Response,
) -> dict[str, object]:
    info, created = await run_in_threadpool(
        keystore.register_key,
        state.db,
        state.log_key,
        name=payload.name,
        role=payload.role,
        public_key=payload.public_key,
        pools=payload.pools,
    )
    if not created:
        response.status_code = 200
    return info.to_dict()


@router.get("", response_model=KeyList, summary="List registered keys")
async def list_keys(state: StateDep, _: ReadRecords) -> dict[str, object]:
    keys = await run_in_threadpool(keystore.list_keys, state.db)
    return {"items": [k.to_dict() for k in keys]}


@router.get("/{key_id}", response_model=KeyPublic, summary="One registered key")
async def get_key(key_id: str, state: StateDep, _: ReadRecords) -> dict[str, object]:
    info = await run_in_threadpool(keystore.get_key, state.db, key_id)
    return info.to_dict()


@router.post(
    "/{key_id}/revoke",
    response_model=KeyPublic,
    summary="Revoke a key (appends a log event)",
    openapi_extra=body_doc(KeyRevoke),
)
async def revoke_key(
    key_id: str, _: Admin, payload: Annotated[KeyRevoke, json_body(KeyRevoke)], state: StateDep
) -> dict[str, object]:
    info, _changed = await run_in_threadpool(
        keystore.revoke_key, state.db, state.log_key, key_id, payload.reason
    )
    return info.to_dict()
