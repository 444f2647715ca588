"""Sending a signed replay order to a worker's collector and checking what comes back.

Used by replays and by certification probes. The order is signed by the log key (the
collector checks it against the ledger's public key); the answer must be a replay output
signed by the collector key the worker registered. Network failures and refusals become
:class:`ledger.errors.Unreachable` (the worker did not give an answer) here, where they enter.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.concurrency import run_in_threadpool

from ledger.errors import Unreachable, VerificationError
from ledger.replay import ORDER_KIND, OUTPUT_KIND, build_order, check_output
from ledger.signing import Envelope, SigningKey, sign_envelope
from ledger.storage import keystore
from ledger.storage.database import Database
from ledger.storage.workers import WorkerInfo

REPLAY_PATH = "/ledger/v1/replay"


def new_replay_id() -> str:
    return "rpl-" + uuid.uuid4().hex


@dataclass(frozen=True)
class WorkerAnswer:
    output: dict[str, Any]  # the signed replay output envelope, as a dict
    body: dict[str, Any]


async def run_order(
    http: httpx.AsyncClient,
    db: Database,
    log_key: SigningKey,
    worker: WorkerInfo,
    *,
    replay_id: str,
    request_id: str,
    endpoint: str,
    request_raw: bytes,
) -> WorkerAnswer:
    """Have ``worker`` run ``request_raw`` once, unrecorded; return its verified output."""
    order = sign_envelope(
        ORDER_KIND,
        build_order(
            replay_id=replay_id,
            request_id=request_id,
            worker_id=worker.worker_id,
            endpoint=endpoint,
            request_raw=base64.b64encode(request_raw).decode("ascii"),
        ),
        log_key,
    )
    try:
        response = await http.post(
            worker.url.rstrip("/") + REPLAY_PATH,
            content=order.canonical,
            headers={"content-type": "application/json"},
        )
    except httpx.HTTPError as exc:
        raise Unreachable(
            f"worker {worker.worker_id} at {worker.url} does not answer: {exc!r}",
            code="worker_unreachable",
        ) from exc
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.status_code != 200 or not isinstance(data, dict):
        error = (data or {}).get("error") if isinstance(data, dict) else None
        message = error.get("message") if isinstance(error, dict) else response.text[:300]
        raise Unreachable(
            f"worker {worker.worker_id} refused the replay (HTTP {response.status_code}): "
            f"{message}",
            code="worker_error",
            details={"status": response.status_code},
        )
    envelope = Envelope.from_dict(data)
    await run_in_threadpool(_verify, db, worker, envelope, replay_id, request_id)
    return WorkerAnswer(json.loads(envelope.canonical), envelope.body)


def _verify(
    db: Database, worker: WorkerInfo, env: Envelope, replay_id: str, request_id: str
) -> None:
    if env.kind != OUTPUT_KIND:
        raise VerificationError(f"worker answered a {env.kind!r}, not a replay output")
    if env.key_id != worker.key_id:
        raise VerificationError(
            f"replay output signed by {env.key_id}, not by the worker's key {worker.key_id}",
            code="wrong_signer",
        )
    with db.read() as s:
        keystore.check_signer(env, keystore.load_keys(s, [env.key_id]))
    body = check_output(env.body)
    if body["replay_id"] != replay_id or body["request_id"] != request_id:
        raise VerificationError("the replay output answers another order", code="wrong_order")
