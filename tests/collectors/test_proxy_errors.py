"""The proxy without a vLLM engine: one that is away (a clear 502, nothing recorded), the
default tier's refusals, what /v1/models forwards, and an engine failing mid-stream."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from collectors import own_answers
from collectors.proxy import create_proxy
from collectors.spool import Spool
from collectors.worker_state import WorkerState
from demo.server_thread import ServerThread, free_port
from ledger.inference_record import body_view
from ledger.packing import unpack_int32
from ledger.signing import SigningKey

AWAY = "http://127.0.0.1:{port}"  # an engine URL nothing listens on


@contextmanager
def running_proxy(
    tmp_path: Path, engine_url: str | None = None, **state: Any
) -> Iterator[tuple[str, WorkerState]]:
    """A proxy over real HTTP in front of ``engine_url`` (default: nothing listening)."""
    spool = Spool(tmp_path / "spool.sqlite")
    worker = WorkerState(
        engine_url=engine_url or AWAY.format(port=free_port()),
        worker_id="w",
        pool="p",
        key=SigningKey.generate(),
        spool=spool,
        fingerprint_id="sha256:" + "0" * 64,
        **{"default_tier": 0, "batch_invariance": "serial", **state},
    )
    server = ServerThread(create_proxy(worker), "127.0.0.1", free_port()).start()
    try:
        yield server.url, worker
    finally:
        server.stop()
        spool.close()


# A streamed completions chunk as vLLM 0.32 sends it, logprobs and token IDs added.
CHUNK = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1,
    "model": "fixture",
    "choices": [
        {
            "index": 0,
            "text": " the",
            "logprobs": {
                "text_offset": [0],
                "token_logprobs": [-0.25],
                "tokens": [" the"],
                "top_logprobs": [{" the": -0.25}],
            },
            "finish_reason": None,
            "stop_reason": None,
            "prompt_token_ids": [1, 2],
            "token_ids": [7],
        }
    ],
}


def test_an_engine_that_does_not_answer_is_a_502(tmp_path: Path):
    with running_proxy(tmp_path) as (url, worker):
        for path, method in (("/v1/completions", "POST"), ("/v1/models", "GET")):
            response = httpx.request(
                method,
                url + path,
                json={"model": "m", "prompt": "x", "max_tokens": 1} if method == "POST" else None,
                headers={"X-Request-ID": "away-1"},
            )
            assert response.status_code == 502, path
            if method == "POST":
                assert response.headers["x-request-id"] == "away-1"
            error = response.json()["error"]
            assert error["code"] == "engine_unreachable" and "does not answer" in error["message"]
        not_json = httpx.post(url + "/v1/chat/completions", content=b"[")
        assert not_json.status_code == 502
        assert worker.spool.pending() == 0


def test_an_engine_that_does_not_answer_gives_no_cors_headers(tmp_path: Path):
    """vLLM down and no collector: the browser cannot connect. Through the collector it gets
    a 502 without CORS headers: the same network error, never an answer vLLM did not allow."""
    with running_proxy(tmp_path) as (url, _):
        response = httpx.post(
            url + "/v1/completions",
            json={"model": "m", "prompt": "x", "max_tokens": 1},
            headers={"origin": "https://console.example"},
        )
    assert response.status_code == 502
    assert not [k for k in response.headers if k.startswith("access-control-")]


def test_the_collectors_own_answers_ask_the_engine_only_what_they_need(tmp_path: Path):
    """An own answer on a path vLLM's API key check guards asks ``GET /v1/models`` with the
    client's credentials and origin; on another path, only a browser's asks (``/health``), so
    a scrape of ``/metrics`` costs the engine nothing. The CORS headers are the engine's
    (Starlette's middleware, as vLLM's), with ``Vary: Origin`` on every own answer."""
    asked: list[tuple[str, str | None, str | None]] = []

    async def seen(request: Request) -> Response:
        asked.append(
            (request.url.path, request.headers.get("origin"), request.headers.get("authorization"))
        )
        return Response(status_code=200)

    engine = ServerThread(
        Starlette(
            routes=[Route("/health", seen), Route("/v1/models", seen)],
            middleware=[
                Middleware(
                    CORSMiddleware,
                    allow_origins=["https://console.example"],
                    allow_credentials=True,
                )
            ],
        ),
        "127.0.0.1",
        free_port(),
    ).start()
    browser = {"origin": "https://console.example"}
    try:
        with running_proxy(tmp_path, engine.url) as (url, _):
            scrape = httpx.get(url + "/metrics")
            shown = httpx.get(url + "/metrics", headers=browser)
            refused = httpx.post(
                url + "/v1/completions",
                json={"model": "m", "prompt": "x"},
                headers={
                    **browser,
                    "X-Reproducibility-Tier": "9",
                    "Authorization": "Bearer k",
                },
            )
            elsewhere = httpx.post(
                url + "/v1/completions",
                json={"model": "m", "prompt": "x"},
                headers={"origin": "https://elsewhere.example", "X-Reproducibility-Tier": "9"},
            )
    finally:
        engine.stop()
    assert scrape.status_code == 200 and scrape.headers["vary"] == "Origin"
    assert "access-control-allow-origin" not in scrape.headers
    for answer in (shown, refused):
        assert answer.headers["access-control-allow-origin"] == "https://console.example"
        assert answer.headers["access-control-allow-credentials"] == "true"
        assert answer.headers["vary"] == "Origin"
    assert refused.status_code == 400 and elsewhere.status_code == 400
    assert "access-control-allow-origin" not in elsewhere.headers
    assert "x-ledger-answer" not in {*scrape.headers, *shown.headers, *refused.headers}
    assert asked == [
        ("/health", "https://console.example", None),
        ("/v1/models", "https://console.example", "Bearer k"),
        ("/v1/models", "https://elsewhere.example", None),
    ]


def test_an_engine_that_hangs_delays_the_collectors_own_answers_at_most_briefly(
    tmp_path: Path,
):
    """An engine wedged on /health: the collector's refusal to a browser still comes, after
    ASK_TIMEOUT, without CORS headers (the next one asks again: nothing false remembered)."""
    hang = threading.Event()

    async def health(request: Request) -> Response:
        await asyncio.to_thread(hang.wait, 30)
        return Response(status_code=200, headers={"access-control-allow-origin": "*"})

    engine = ServerThread(
        Starlette(routes=[Route("/v1/models", health)]), "127.0.0.1", free_port()
    ).start()
    try:
        with running_proxy(tmp_path, engine.url) as (url, _):
            started = time.monotonic()
            answer = httpx.post(
                url + "/v1/completions",
                json={"model": "m", "prompt": "x"},
                headers={"origin": "https://console.example", "X-Reproducibility-Tier": "9"},
                timeout=20,
            )
            waited = time.monotonic() - started
            hang.set()
            again = httpx.post(
                url + "/v1/completions",
                json={"model": "m", "prompt": "x"},
                headers={"origin": "https://console.example", "X-Reproducibility-Tier": "9"},
                timeout=20,
            )
    finally:
        hang.set()
        engine.stop()
    assert answer.status_code == 400 and "access-control-allow-origin" not in answer.headers
    assert own_answers.ASK_TIMEOUT <= waited < own_answers.ASK_TIMEOUT + 5
    assert again.status_code == 400 and again.headers["access-control-allow-origin"] == "*"


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
    try:
        with running_proxy(tmp_path, engine.url) as (url, _):
            answer = httpx.get(
                url + "/v1/models?limit=1", headers={"Authorization": "Bearer sk-engine"}
            )
            assert answer.status_code == 200 and answer.json()["data"] == [{"id": "fixture"}]
            assert httpx.get(url + "/v1/models").status_code == 401
            assert seen == [("limit=1", "Bearer sk-engine"), ("", None)]
    finally:
        engine.stop()


def test_the_collectors_default_tier_applies_without_the_header(tmp_path: Path):
    # Refusals come before the engine is called, so an engine that is away shows which
    # requests got past the policy (502) and which did not (409).
    sampled = {"model": "m", "prompt": "x", "max_tokens": 1, "temperature": 0.7}
    with running_proxy(tmp_path, default_tier=1, batch_invariance="none") as (url, worker):
        refused = httpx.post(url + "/v1/completions", json=sampled)
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "tier_refused"
        seeded = httpx.post(url + "/v1/completions", json={**sampled, "seed": 3})
        assert seeded.status_code == 502
        tier_0 = httpx.post(
            url + "/v1/completions", json=sampled, headers={"X-Reproducibility-Tier": "0"}
        )
        assert tier_0.status_code == 502
        worker.default_tier = 2  # greedy, but this worker is not batch-invariant
        greedy = httpx.post(url + "/v1/completions", json={**sampled, "temperature": 0})
        assert greedy.status_code == 409
        assert any("batch-invariant" in m for m in greedy.json()["error"]["details"]["missing"])


def engine_streaming(*events: bytes, silence: float = 0.0) -> ServerThread:
    """An engine whose completions answer is these bytes, as one event stream, after which it
    sends nothing for ``silence`` seconds before it ends the stream."""

    async def completions(_: Request) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            for event in events:
                yield event
            await asyncio.sleep(silence)

        return StreamingResponse(body(), media_type="text/event-stream")

    return ServerThread(
        Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])]),
        "127.0.0.1",
        free_port(),
    ).start()


def test_an_engine_error_mid_stream_reaches_the_client_and_marks_the_record(tmp_path: Path):
    # vLLM reports a failure during generation as an error chunk, then ends the stream. No
    # vLLM here can be made to fail on demand: this engine sends what vLLM 0.32 sends.
    error = {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}
    engine = engine_streaming(
        *(b"data: " + json.dumps(data).encode() + b"\n\n" for data in (CHUNK, error)),
        b"data: [DONE]\n\n",
    )
    body = {"model": "fixture", "prompt": "x", "max_tokens": 4, "stream": True}
    try:
        with running_proxy(tmp_path, engine.url) as (url, worker):
            answer = httpx.post(url + "/v1/completions", json=body, headers={"X-Request-ID": "e1"})
            events = [e for e in answer.text.split("\n\n") if e]
            assert answer.status_code == 200 and len(events) == 3
            assert json.loads(events[1][6:]) == error and events[2] == "data: [DONE]"
            assert json.loads(events[0][6:])["choices"][0]["logprobs"] is None  # not asked
            (item,) = worker.spool.oldest(10)
            record = body_view(json.loads(item.envelope))
            assert record["aborted"] is True and record["choices"][0]["finish_reason"] is None
            sample = worker.metrics.registry.get_sample_value
            assert sample("collector_engine_errors_total", {"status": "stream"}) == 1
            outcome = {"endpoint": "/v1/completions", "outcome": "engine_error"}
            assert sample("collector_requests_total", outcome) == 1
    finally:
        engine.stop()


def test_a_stream_of_only_an_error_chunk_is_delivered_whole_and_counted(tmp_path: Path):
    # vLLM 0.32 answers some requests (logprobs above its maximum, prompt token IDs outside
    # the vocabulary) with 200, one error chunk and [DONE]: no record can hold that, but the
    # client must get the stream whole, and /metrics must say it was not recorded.
    error = {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}}
    sent = b"data: " + json.dumps(error).encode() + b"\n\ndata: [DONE]\n\n"
    engine = engine_streaming(sent)
    body = {"model": "fixture", "prompt": "x", "max_tokens": 4, "stream": "true"}
    try:
        with running_proxy(tmp_path, engine.url) as (url, worker):
            answer = httpx.post(url + "/v1/completions", json=body)
            assert answer.status_code == 200 and answer.content == sent
            assert worker.spool.pending() == 0
            sample = worker.metrics.registry.get_sample_value
            assert sample("collector_unrecordable_total", {"reason": "record_invalid"}) == 1
    finally:
        engine.stop()


def test_an_event_that_is_not_utf8_json_passes_as_it_came_and_the_rest_is_recorded(
    tmp_path: Path,
):
    # The collector reads vLLM's events as bytes: one it cannot parse (here not even UTF-8)
    # reaches the client unchanged instead of cutting the stream, and the chunks around it
    # are recorded as usual.
    odd = b"data: \xff\xfe not json\n\n"
    engine = engine_streaming(
        b"data: " + json.dumps(CHUNK).encode() + b"\n\n", odd, b"data: [DONE]\n\n"
    )
    body = {"model": "fixture", "prompt": "x", "max_tokens": 4, "stream": True}
    try:
        with running_proxy(tmp_path, engine.url) as (url, worker):
            answer = httpx.post(url + "/v1/completions", json=body, headers={"X-Request-ID": "u1"})
            assert answer.status_code == 200
            events = [e for e in answer.content.split(b"\n\n") if e]
            assert events[1:] == [odd.strip(), b"data: [DONE]"]
            (item,) = worker.spool.oldest(10)
            record = body_view(json.loads(item.envelope))
            assert "aborted" not in record  # the stream ended with [DONE]
            assert unpack_int32(record["choices"][0]["token_ids"]) == [7]
    finally:
        engine.stop()


def engine_then_silence() -> ServerThread:
    """An engine that sends one chunk of a long streamed answer, then nothing for 30 s."""
    return engine_streaming(b"data: " + json.dumps(CHUNK).encode() + b"\n\n", silence=30)


def leave_after_the_first_chunk(url: str, request_id: str) -> None:
    body = {"model": "fixture", "prompt": "x", "max_tokens": 64, "stream": True}
    with httpx.stream(
        "POST", url + "/v1/completions", json=body, headers={"X-Request-ID": request_id}
    ) as answer:
        next(line for line in answer.iter_lines() if line.startswith("data: "))


def test_a_proxy_stopping_as_a_client_leaves_still_spools_its_aborted_record(tmp_path: Path):
    # The record of a client that left mid-stream is signed and committed by a task of its own
    # on the proxy's loop; a proxy told to stop meanwhile waits for it before its loop ends.
    # The spool's writer is held back here until the stop is under way.
    engine = engine_then_silence()
    spool = Spool(tmp_path / "spool.sqlite")
    worker = WorkerState(
        engine_url=engine.url,
        worker_id="w",
        pool="p",
        key=SigningKey.generate(),
        spool=spool,
        fingerprint_id="sha256:" + "0" * 64,
        default_tier=0,
        batch_invariance="serial",
    )
    server = ServerThread(create_proxy(worker), "127.0.0.1", free_port()).start()
    try:
        with spool._write_lock:  # the writer cannot commit until this block ends
            leave_after_the_first_chunk(server.url, "s1")
            deadline = time.monotonic() + 10
            while not worker.leaving and time.monotonic() < deadline:
                time.sleep(0.01)
            assert worker.leaving, "the aborted record was not handed to a task"
            stopping = threading.Thread(target=server.stop)
            stopping.start()
            time.sleep(0.5)  # the proxy is stopping, its record still waits for the writer
            assert server.thread.is_alive()
        stopping.join(timeout=20)
        assert not server.thread.is_alive() and not worker.leaving
        (item,) = spool.oldest(10)
        assert item.request_id == "s1"
        assert body_view(json.loads(item.envelope))["aborted"] is True
        outcome = {"endpoint": "/v1/completions", "outcome": "aborted"}
        assert worker.metrics.registry.get_sample_value("collector_requests_total", outcome) == 1
    finally:
        server.stop()
        spool.close()
        engine.stop()


def test_a_failure_recording_a_client_that_left_is_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    class BrokenKey:  # a bug in signing, which no input can cause
        key_id = "ed25519:broken"

        def sign(self, _: bytes) -> str:
            raise RuntimeError("signing failed")

    engine = engine_then_silence()
    try:
        with running_proxy(tmp_path, engine.url) as (url, worker):
            worker.key = BrokenKey()  # type: ignore[assignment]
            with caplog.at_level(logging.ERROR, logger="ledger.collector"):
                leave_after_the_first_chunk(url, "b1")
                deadline = time.monotonic() + 10
                outcome = {"endpoint": "/v1/completions", "outcome": "not_recorded"}
                sample = worker.metrics.registry.get_sample_value
                while sample("collector_requests_total", outcome) != 1:
                    assert time.monotonic() < deadline, "the failure was not counted"
                    time.sleep(0.01)
            assert worker.spool.pending() == 0 and not worker.leaving
            assert "request b1: the record of a client that left failed" in caplog.text
            assert "signing failed" in caplog.text
    finally:
        engine.stop()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/health"])
def test_a_client_that_leaves_before_its_whole_body_is_counted_not_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, path: str
):
    """A body shorter than its Content-Length, then the client gone: nothing reaches the
    engine or the spool, the request counts as aborted, and no traceback is logged."""
    with running_proxy(tmp_path) as (url, worker), caplog.at_level(logging.ERROR):
        where = urlsplit(url)
        with socket.create_connection((where.hostname, where.port)) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                'Content-Length: 100\r\n\r\n{"model"'.encode()
            )
            time.sleep(0.2)
        labels = {"endpoint": path, "outcome": "aborted"}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if worker.metrics.registry.get_sample_value("collector_requests_total", labels):
                break
            time.sleep(0.05)
        assert worker.metrics.registry.get_sample_value("collector_requests_total", labels) == 1
        time.sleep(0.2)  # what the server would log after its answer
        assert "ClientDisconnect" not in caplog.text and "Exception" not in caplog.text
        assert worker.spool.pending() == 0
