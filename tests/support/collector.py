"""A recording proxy in-process (real HTTP) before a real engine, shipping to a real ledger."""

from __future__ import annotations

import base64
import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.collector import Collector, CollectorConfig
from collectors.proxy import create_proxy
from demo.server_thread import ServerThread, free_port
from ledger.inference_record import body_view
from tests.support.engine import EngineServer
from tests.support.harness import Harness


@dataclass
class RunningCollector:
    collector: Collector
    server: ServerThread

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        self.server.stop()
        self.collector.close()


def start_collector(
    engine: EngineServer,
    api: Harness,
    spool_dir: Path,
    *,
    pool: str = "strict",
    worker_id: str | None = None,
    register: bool = False,
) -> RunningCollector:
    """A collector before ``engine``; with ``register`` it registers as a worker (replays)."""
    key = api.collector()
    port = free_port()
    config = CollectorConfig(
        engine_url=engine.url,
        ledger_url=api.url,
        ledger_token=api.token("records:write"),
        key=key,
        pool=pool,
        worker_id=worker_id or f"w-{uuid.uuid4().hex[:8]}",
        model_dir=engine.model_dir,
        spool_path=spool_dir / "spool.sqlite",
        digest_cache=spool_dir / "digests.sqlite",
        advertise_url=f"http://127.0.0.1:{port}" if register else None,
        heartbeat_interval=1.0,
    )
    collector = Collector(config).start()
    server = ServerThread(create_proxy(collector.state), "127.0.0.1", port).start()
    return RunningCollector(collector, server)


def wait_for_record(api: Harness, request_id: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    client = api.client()
    while time.monotonic() < deadline:
        response = client.get(f"/v1/records/{request_id}")
        if response.status_code == 200:
            return body_view(response.json())
        time.sleep(0.1)
    raise AssertionError(f"record {request_id} did not reach the ledger within {timeout} s")


def ints(packed: str) -> list[int]:
    raw = base64.b64decode(packed)
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))


def float_bits(packed: str) -> bytes:
    return base64.b64decode(packed)


def f32_bits(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)
