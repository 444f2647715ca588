"""An engine restarted with other flags: the collector notices and records the new fingerprint."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.collector import start_collector, wait_for_record
from tests.support.engine import EngineServer, engine_python
from tests.support.harness import Harness

pytestmark = pytest.mark.engine
BODY = {"model": "fixture", "prompt": "restart", "max_tokens": 2, "temperature": 0}


# One backend is enough here: the ledger side is an ordinary fingerprint registration.
@pytest.mark.parametrize("api", ["sqlite"], indirect=True)
def test_an_engine_restart_is_resnapshotted(
    fixture_models: dict[str, Path], api: Harness, tmp_path: Path
):
    engine = EngineServer(fixture_models["tiny"], (), tmp_path / "vllm.log", engine_python())
    engine.start().wait_ready()
    running = start_collector(engine, api, tmp_path, pool="restart")
    try:
        before = running.collector.state.fingerprint_id
        first = httpx.post(f"{running.url}/v1/completions", json=BODY, timeout=60)
        assert wait_for_record(api, first.headers["x-request-id"])["fingerprint_id"] == before
        engine.stop()
        engine.args = ("--max-num-seqs", "2")
        engine.start().wait_ready()
        deadline = time.monotonic() + 60
        while running.collector.state.fingerprint_id == before and time.monotonic() < deadline:
            time.sleep(0.5)
        after = running.collector.state.fingerprint_id
        assert after != before
        assert running.collector.snapshot.body["engine"]["max_num_seqs"] == 2
        second = httpx.post(f"{running.url}/v1/completions", json=BODY, timeout=60)
        assert wait_for_record(api, second.headers["x-request-id"])["fingerprint_id"] == after
        stored = api.client().get(f"/v1/fingerprints/{after}")
        assert stored.status_code == 200
    finally:
        running.close()
        engine.stop()
