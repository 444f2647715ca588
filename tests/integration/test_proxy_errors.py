"""The proxy when the engine is away: a clear 502, nothing recorded."""

from __future__ import annotations

from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

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
            if method == "POST":
                assert response.headers["x-request-id"] == "away-1"
            error = response.json()["error"]
            assert error["code"] == "engine_unreachable" and "does not answer" in error["message"]
        not_json = httpx.post(server.url + "/v1/chat/completions", content=b"[")
        assert not_json.status_code == 502
        assert spool.pending() == 0
    finally:
        server.stop()
        spool.close()


def test_models_pass_through_with_the_clients_credentials_and_query(tmp_path: Path):
    # A vLLM server started with --api-key answers /v1/models only with the client's key.
    seen: list[tuple[str, str | None]] = []

    async def models(request: Request) -> JSONResponse:
        seen.append((str(request.url.query), request.headers.get("authorization")))
        if request.headers.get("authorization") != "Bearer sk-engine":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return JSONResponse({"object": "list", "data": [{"id": "fixture"}]})

    engine = ServerThread(
        Starlette(routes=[Route("/v1/models", models)]), "127.0.0.1", free_port()
    ).start()
    spool = Spool(tmp_path / "spool.sqlite")
    state = WorkerState(
        engine_url=engine.url,
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
        answer = httpx.get(
            server.url + "/v1/models?limit=1", headers={"Authorization": "Bearer sk-engine"}
        )
        assert answer.status_code == 200 and answer.json()["data"] == [{"id": "fixture"}]
        assert httpx.get(server.url + "/v1/models").status_code == 401
        assert seen == [("limit=1", "Bearer sk-engine"), ("", None)]
    finally:
        server.stop()
        engine.stop()
        spool.close()


def test_the_collectors_default_tier_applies_without_the_header(tmp_path: Path):
    # Refusals come before the engine is called, so an engine that is away shows which
    # requests got past the policy (502) and which did not (409).
    spool = Spool(tmp_path / "spool.sqlite")
    state = WorkerState(
        engine_url=f"http://127.0.0.1:{free_port()}",
        worker_id="w",
        pool="p",
        default_tier=1,
        key=SigningKey.generate(),
        spool=spool,
        fingerprint_id="sha256:" + "0" * 64,
        batch_invariance="none",
    )
    server = ServerThread(create_proxy(state), "127.0.0.1", free_port()).start()
    sampled = {"model": "m", "prompt": "x", "max_tokens": 1, "temperature": 0.7}
    try:
        refused = httpx.post(server.url + "/v1/completions", json=sampled)
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "tier_refused"
        seeded = httpx.post(server.url + "/v1/completions", json={**sampled, "seed": 3})
        assert seeded.status_code == 502
        tier_0 = httpx.post(
            server.url + "/v1/completions", json=sampled, headers={"X-Reproducibility-Tier": "0"}
        )
        assert tier_0.status_code == 502
        state.default_tier = 2  # greedy, but this worker is not batch-invariant
        greedy = httpx.post(server.url + "/v1/completions", json={**sampled, "temperature": 0})
        assert greedy.status_code == 409
        assert any("batch-invariant" in m for m in greedy.json()["error"]["details"]["missing"])
    finally:
        server.stop()
        spool.close()
