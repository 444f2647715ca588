"""A worker to certify without an engine: a real HTTP server answering the ledger's signed
replay orders as a collector does, with outputs signed by its collector key.

It checks each order the way a collector does (signed by the log key, addressed to it,
recent) and answers a replay output whose tokens are a fixed function of the prompt, so every
comparison is bitwise. Probes can be slowed (``delay``) or held after a number of answers
(``hold_after``) until ``release`` is set, to catch a job mid-run. It heartbeats every
``BEAT_EVERY`` seconds, as a collector does, until closed (``stop_answering`` leaves it live
but gone from its URL). Certification on real engines is in test_replay.py.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from client.ledger_client import LedgerClient
from demo.server_thread import ServerThread, free_port
from ledger.heartbeat import HEARTBEAT_KIND, build_heartbeat
from ledger.records import Choice
from ledger.replay import OUTPUT_KIND, ReplayedChoice, build_output, check_order
from ledger.signing import (
    Envelope,
    SigningKey,
    load_public_key,
    public_key_pem,
    sign_envelope,
    verify_envelope,
)
from tests.support.documents import fingerprint_envelope

BEAT_EVERY = 3.0


@dataclass
class Worker:
    """A worker's replay endpoint (``/ledger/v1/replay``), as its collector serves it."""

    key: SigningKey
    worker_id: str
    pool: str
    fingerprint_id: str
    log_key: Any  # the ledger's public key, which signs the orders
    delay: float = 0.1  # seconds per probe
    hold_after: int | None = None  # answer this many probes, hold the rest until release
    release: threading.Event = field(default_factory=threading.Event)
    received: int = 0  # orders that passed the checks
    answered: int = 0
    server: ServerThread | None = None
    stopped: threading.Event = field(default_factory=threading.Event)
    beats: threading.Thread | None = None
    spool_pending: int | None = None  # what its heartbeats say of its collector's spool

    async def replay(self, request: Request) -> Response:
        env = Envelope.from_dict(json.loads(await request.body()))
        verify_envelope(env, self.log_key)
        order = check_order(env.body, self.worker_id)
        self.received += 1
        if self.hold_after is not None and self.received > self.hold_after:
            while not self.release.is_set():
                await asyncio.sleep(0.05)
        await asyncio.sleep(self.delay)
        probe = json.loads(base64.b64decode(order["request_raw"]))
        digest = hashlib.sha256(probe["prompt"].encode()).digest()
        tokens = [digest[i % 32] * 7 + i for i in range(probe["max_tokens"])]
        body = build_output(
            order=order,
            fingerprint_id=self.fingerprint_id,
            prompt_token_ids=list(probe["prompt"].encode()[:32]),
            choices=[
                ReplayedChoice(
                    Choice(tokens, [-t / 4096 for t in tokens], finish_reason="length"),
                    [0.25 + t / 8192 for t in tokens],
                )
            ],
            system_fingerprint=None,
            started_at="2026-12-01T00:00:00Z",
            total_ns=int(self.delay * 1e9),
        )
        self.answered += 1
        return Response(sign_envelope(OUTPUT_KIND, body, self.key).canonical, 200)

    def start(self) -> str:
        app = Starlette(routes=[Route("/ledger/v1/replay", self.replay, methods=["POST"])])
        self.server = ServerThread(app, "127.0.0.1", free_port()).start()
        return self.server.url

    def heartbeat(self, api: LedgerClient) -> None:
        assert self.server is not None
        beat = build_heartbeat(
            worker_id=self.worker_id,
            pool=self.pool,
            url=self.server.url,
            fingerprint_id=self.fingerprint_id,
            spool_pending=self.spool_pending,
        )
        api.heartbeat(sign_envelope(HEARTBEAT_KIND, beat, self.key))

    def keep_alive(self, api_url: str, token: str) -> None:
        def beat() -> None:
            with LedgerClient(api_url, token) as api:
                while not self.stopped.wait(BEAT_EVERY):
                    with suppress(Exception):  # the ledger may be restarting: next beat
                        self.heartbeat(api)

        self.beats = threading.Thread(target=beat, name=f"beats-{self.worker_id}", daemon=True)
        self.beats.start()

    def stop_answering(self) -> None:
        """Nothing listens at the worker's URL any more; its heartbeats go on."""
        self.release.set()
        if self.server is not None:
            self.server.stop()

    def close(self) -> None:
        self.stopped.set()
        self.stop_answering()
        if self.beats is not None:
            self.beats.join(30)


def add_worker(api_url: str, admin_token: str, **kw: Any) -> Worker:
    """A collector key, its fingerprint, and a running worker registered in a new pool."""
    key = SigningKey.generate()
    with LedgerClient(api_url, admin_token) as api:
        api.register_key(f"c-{key.key_id[8:16]}", "collector", public_key_pem(key.public_key))
        fp = api.register_fingerprint(fingerprint_envelope(key))["fingerprint_id"]
        log_key = load_public_key(api.log_key()["pem"])
        worker = Worker(
            key, f"w-{uuid.uuid4().hex[:8]}", f"pool-{uuid.uuid4().hex[:8]}", fp, log_key, **kw
        )
        worker.start()
        try:
            worker.heartbeat(api)
        except BaseException:
            worker.close()
            raise
    worker.keep_alive(api_url, admin_token)
    return worker
