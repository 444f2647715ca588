"""The proxy when the engine is away: a clear 502, nothing recorded."""

from __future__ import annotations

from pathlib import Path

import httpx

from cli.server_thread import ServerThread, free_port
from collectors.proxy import WorkerState, create_proxy
from collectors.spool import Spool
from ledger.signing import SigningKey


def test_an_engine_that_does_not_answer_is_a_502(tmp_path: Path):
    spool = Spool(tmp_path / "spool.sqlite")
    state = WorkerState(
        engine_url=f"http://127.0.0.1:{free_port()}",
        worker_id="w",
        pool="p",
        default_tier=0,
        key=SigningKey.generate(),
        spool=spool,
        fingerprint_id="sha256:" + "0" * 64,
        batch_invariance="serial",
    )
    server = ServerThread(create_proxy(state), "127.0.0.1", free_port()).start()
    try:
        for path, method in (("/v1/completions", "POST"), ("/v1/models", "GET")):
            response = httpx.request(
                method,
                server.url + path,
                json={"model": "m", "prompt": "x", "max_tokens": 1} if method == "POST" else None,
                headers={"X-Request-ID": "away-1"},
            )
            assert response.status_code == 502, path
            error = response.json()["error"]
            assert error["code"] == "engine_unreachable" and "does not answer" in error["message"]
        not_json = httpx.post(server.url + "/v1/chat/completions", content=b"[")
        assert not_json.status_code == 502
        assert spool.pending() == 0
    finally:
        server.stop()
        spool.close()
