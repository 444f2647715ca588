"""An engine restarted with other flags: the collector notices and records the new fingerprint."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from collectors.replay import REPLAY_PATH
from ledger.errors import InvalidInput
from ledger.replay import ORDER_KIND, build_order
from ledger.signing import sign_envelope
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


@pytest.mark.parametrize("api", ["sqlite"], indirect=True)
def test_a_failed_resnapshot_refuses_requests_until_one_holds(
    tiny_engine: EngineServer, api: Harness, tmp_path: Path
):
    """A re-snapshot that fails after an engine restart (the model being replaced, a name the
    fingerprint cannot hold) left records signed under the old fingerprint, and was never
    tried again; one that raised anything but a LedgerError killed the watcher. Now requests
    that would be recorded, and replays, are refused (503 fingerprint_unsure) while the
    environment is unknown, and the watcher tries again at every poll until one holds."""
    running = start_collector(tiny_engine, api, tmp_path, pool="unsure")
    collector = running.collector
    real = collector._snapshot
    failures = [
        InvalidInput("model file config.json changed while it was hashed", code="model_changed"),
        UnicodeEncodeError("utf-8", "odd-\udcff", 4, 5, "surrogates not allowed"),
    ]

    replacing = threading.Event()  # set: the model is still being replaced
    replacing.set()

    def failing() -> object:
        if failures:
            raise failures.pop(0)
        if replacing.is_set():
            raise InvalidInput("model file config.json changed again", code="model_changed")
        return real()

    try:
        before = collector.state.fingerprint_id
        deadline = time.monotonic() + 30
        while collector.state.log_public_key is None and time.monotonic() < deadline:
            time.sleep(0.1)  # learnt at start: replay orders are verified with it
        collector._snapshot = failing  # type: ignore[method-assign]
        collector.resnapshot()  # as the watcher does when the engine came back
        refused = httpx.post(f"{running.url}/v1/completions", json=BODY, timeout=60)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "2"
        error = refused.json()["error"]
        assert error["code"] == "fingerprint_unsure"
        assert "config.json" not in error["message"]  # the reason stays in the log
        assert not collector.spool.holds(refused.headers["x-request-id"])
        # judged before the tier is, on facts that may be stale: retry, not a refusal
        sampled = httpx.post(
            f"{running.url}/v1/completions",
            json={**BODY, "temperature": 0.7},
            headers={"X-Reproducibility-Tier": "2"},
            timeout=60,
        )
        assert sampled.status_code == 503 and "fingerprint_unsure" in sampled.text
        # a replay order signed by the log key: verified, then refused (nothing run)
        order = build_order(
            replay_id=f"rpl-{uuid.uuid4().hex}",
            request_id="req-unsure",
            worker_id=collector.config.worker_id,
            endpoint="/v1/completions",
            request_raw=base64.b64encode(json.dumps(BODY).encode()).decode(),
        )
        signed = sign_envelope(ORDER_KIND, order, api.log_key).canonical
        replay = httpx.post(f"{running.url}{REPLAY_PATH}", content=signed, timeout=60)
        assert replay.status_code == 503 and "fingerprint_unsure" in replay.text
        # the watcher retries at each poll (the second failure is no LedgerError) and lives
        deadline = time.monotonic() + 30
        while failures and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not failures and collector.state.fingerprint_unsure is not None
        replacing.clear()  # the model is in place: the next try holds
        while collector.state.fingerprint_unsure is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert collector.state.fingerprint_unsure is None
        assert collector._watcher.is_alive()
        assert collector.metrics.snapshot_failures._value.get() >= 2
        again = httpx.post(f"{running.url}/v1/completions", json=BODY, timeout=60)
        assert again.status_code == 200, again.text
        recorded = wait_for_record(api, again.headers["x-request-id"])
        assert recorded["fingerprint_id"] == before  # the same engine: the same fingerprint
    finally:
        running.close()
