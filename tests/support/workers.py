"""Workers for tests: signed heartbeats, fingerprints with an engine section, and a fake
worker (a real HTTP server) that answers replay orders with outputs signed by a key of ours."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from demo.server_thread import ServerThread, free_port
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.heartbeat import HEARTBEAT_KIND, build_heartbeat
from ledger.packing import unpack_float32, unpack_int32
from ledger.records import Choice
from ledger.replay import OUTPUT_KIND, ReplayedChoice, build_output
from ledger.signing import Envelope, SigningKey, sign_envelope
from tests.support.harness import Harness


def register_fingerprint(api: Harness, key: SigningKey, engine: dict[str, Any] | None) -> str:
    """A fingerprint whose body has ``engine`` as its engine section (None: no section)."""
    body: dict[str, Any] = {"schema_version": 1, "model": {"name": f"m-{uuid.uuid4().hex[:8]}"}}
    if engine is not None:
        body["engine"] = engine
    env = sign_envelope(FINGERPRINT_KIND, body, key)
    response = api.client().post("/v1/fingerprints", content=env.canonical)
    assert response.status_code == 201, response.text
    fp: str = response.json()["fingerprint_id"]
    return fp


def serial_engine() -> dict[str, Any]:
    return {
        "name": "vllm",
        "max_num_seqs": 1,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": False,
        "batch_invariance": "serial",
    }


def engine_deriving(invariance: str) -> dict[str, Any]:
    """An engine section whose signed flags derive ``invariance`` (kernel, serial or none)."""
    if invariance == "serial":
        return serial_engine()
    if invariance == "kernel":
        return {"name": "vllm", "env": {"VLLM_BATCH_INVARIANT": "1"}, "batch_invariance": "kernel"}
    return {"name": "vllm", "max_num_seqs": 256, "batch_invariance": "none"}


def heartbeat(
    key: SigningKey,
    *,
    worker_id: str,
    pool: str,
    url: str,
    fingerprint_id: str,
    issued_at: datetime | None = None,
    kind: str = HEARTBEAT_KIND,
    **extra: Any,
) -> Envelope:
    body = build_heartbeat(
        worker_id=worker_id, pool=pool, url=url, fingerprint_id=fingerprint_id, issued_at=issued_at
    )
    return sign_envelope(kind, {**body, **extra}, key)


def post_heartbeat(api: Harness, envelope: Envelope | dict[str, Any] | bytes) -> httpx.Response:
    content = (
        envelope.canonical
        if isinstance(envelope, Envelope)
        else envelope
        if isinstance(envelope, bytes)
        else json.dumps(envelope).encode()
    )
    return api.client(api.token("records:write")).post(
        "/v1/workers", content=content, headers={"content-type": "application/json"}
    )


@dataclass
class FakeWorker:
    """A collector impostor: answers any replay order with ``key``'s signature over the
    recorded record's own tokens and logprobs (a bitwise copy), naming ``worker_id`` if set."""

    key: SigningKey
    record: dict[str, Any] | None = None
    worker_id: str | None = None
    orders: list[dict[str, Any]] = field(default_factory=list)
    server: ServerThread | None = None
    # Edits the output body before it is signed (a collector that signs what it likes).
    tamper: Callable[[dict[str, Any]], None] | None = None
    # Answers the order instead (a worker that refuses, trickles or floods).
    respond: Callable[[dict[str, Any]], Response] | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    async def _replay(self, request: Request) -> Response:
        order = json.loads(await request.body())["body"]
        self.orders.append(order)
        if self.respond is not None:
            return self.respond(order)
        record = self.record
        assert record is not None
        choices = [
            ReplayedChoice(
                Choice(
                    unpack_int32(c["token_ids"]),
                    unpack_float32(c["logprobs"]),
                    finish_reason=c.get("finish_reason"),
                )
            )
            for c in record["choices"]
        ]
        output = build_output(
            order={**order, "worker_id": self.worker_id or order["worker_id"]},
            fingerprint_id=record["fingerprint_id"],
            prompt_token_ids=unpack_int32(record["prompt_token_ids"]),
            choices=choices,
            system_fingerprint=record.get("system_fingerprint"),
            started_at="2026-12-02T10:00:00.000000Z",
            total_ns=1000,
        )
        if self.tamper is not None:
            self.tamper(output)
        return JSONResponse(sign_envelope(OUTPUT_KIND, output, self.key).to_dict())

    def start(self, host: str = "127.0.0.1") -> FakeWorker:
        app = Starlette(routes=[Route("/ledger/v1/replay", self._replay, methods=["POST"])])
        self.server = ServerThread(app, host, free_port(host)).start()
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
