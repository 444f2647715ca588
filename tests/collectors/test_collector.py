"""The recording collector in front of real vLLM CPU (strict pool), shipping to a real ledger."""

from __future__ import annotations

import base64
import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.collector import (
    RunningCollector,
    f32_bits,
    float_bits,
    ints,
    start_collector,
    wait_for_record,
)
from tests.support.differential import merged_stream
from tests.support.engine import EngineServer
from tests.support.harness import Harness

pytestmark = pytest.mark.engine
VOLATILE = ("id", "created")


@pytest.fixture(scope="module")
def proxy(
    engines: dict[str, EngineServer], api: Harness, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningCollector]:
    running = start_collector(engines["strict"], api, tmp_path_factory.mktemp("collector"))
    yield running
    running.close()


def _stable(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in VOLATILE}


def call(url: str, endpoint: str, body: dict[str, Any], headers: dict[str, str] | None = None):
    """(status, headers, parsed body or list of parsed chunks)."""
    with httpx.Client(timeout=120) as client:
        response = client.post(url + endpoint, json=body, headers=headers or {})
    if not body.get("stream") or response.status_code != 200:
        return response.status_code, response.headers, response.json()
    chunks = []
    for line in response.text.split("\n\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            chunks.append(json.loads(line[6:]))
    assert response.text.rstrip().endswith("data: [DONE]")
    return response.status_code, response.headers, chunks


def stable(value: Any) -> Any:
    """An answer without its per-request IDs and times; a stream by its content per choice,
    whatever its chunking (vLLM coalesces tokens into fewer chunks when its reader falls
    behind, so two runs of one request may split the same tokens differently)."""
    if isinstance(value, list):
        return merged_stream([_stable(v) for v in value])
    return _stable(value)


COMPLETION = {"model": "fixture", "prompt": "The ledger keeps", "max_tokens": 6, "temperature": 0}
CHAT = {
    "model": "fixture",
    "messages": [{"role": "user", "content": "What is a replay?"}],
    "max_tokens": 6,
    "temperature": 0,
}
CASES = {
    "completion": ("/v1/completions", COMPLETION),
    "completion-logprobs": ("/v1/completions", {**COMPLETION, "logprobs": 2}),
    "completion-n2-seeded": (
        "/v1/completions",
        {**COMPLETION, "n": 2, "temperature": 0.8, "seed": 7},
    ),
    "chat": ("/v1/chat/completions", CHAT),
    "chat-logprobs": ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 3}),
    "chat-token-ids": ("/v1/chat/completions", {**CHAT, "return_token_ids": True}),
    # Top-k alternatives: the collector asks for token IDs and renders the strings back; the
    # prompts split multi-byte characters into byte pieces (U+FFFD repairs in the strings).
    "completion-top5-multibyte": (
        "/v1/completions",
        {**COMPLETION, "prompt": "Grüße aus 東京 🙂 und", "logprobs": 5, "max_tokens": 12},
    ),
    "chat-top4-multibyte": (
        "/v1/chat/completions",
        {
            **CHAT,
            "messages": [{"role": "user", "content": "Ça va? 日本語 🙂"}],
            "logprobs": True,
            "top_logprobs": 4,
            "max_tokens": 12,
        },
    ),
    "completion-top3-ids-asked": (
        "/v1/completions",
        {**COMPLETION, "logprobs": 3, "return_tokens_as_token_ids": True},
    ),
}


def reference(engine: EngineServer, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """The engine's own token IDs and logprobs for ``body`` (strict pool: deterministic)."""
    ask = {**copy.deepcopy(body), "stream": False, "return_token_ids": True}
    if endpoint == "/v1/chat/completions":
        ask.setdefault("logprobs", True)
    else:
        ask.setdefault("logprobs", 0)
    status, _, data = call(engine.url, endpoint, ask)
    assert status == 200
    return data


def shown_alternatives(response: Any) -> list[str]:
    """The alternatives' token strings in a client's response (or stream chunks)."""
    shown = []
    for data in response if isinstance(response, list) else [response]:
        for choice in data["choices"]:
            logprobs = choice.get("logprobs") or {}
            for item in logprobs.get("content") or []:
                shown.extend(t["token"] for t in item["top_logprobs"])
            for row in logprobs.get("top_logprobs") or []:
                shown.extend(row)
    return shown


def engine_alternatives(
    engine: EngineServer, endpoint: str, body: dict[str, Any]
) -> list[list[dict[int, float]]]:
    """Per choice and position, the engine's alternatives by token ID (what it lists, sampled
    token included; completions add it when it is outside the top-k)."""
    ask = {**copy.deepcopy(body), "stream": False, "return_tokens_as_token_ids": True}
    status, _, data = call(engine.url, endpoint, ask)
    assert status == 200
    out = []
    for choice in data["choices"]:
        if endpoint == "/v1/chat/completions":
            rows = [
                {int(t["token"].split(":")[1]): t["logprob"] for t in item["top_logprobs"]}
                for item in choice["logprobs"]["content"]
            ]
        else:
            rows = [
                {int(k.split(":")[1]): v for k, v in row.items()}
                for row in choice["logprobs"]["top_logprobs"]
            ]
        out.append(rows)
    return out


def engine_logprobs(endpoint: str, choice: dict[str, Any]) -> list[float]:
    if endpoint == "/v1/chat/completions":
        return [item["logprob"] for item in choice["logprobs"]["content"]]
    return choice["logprobs"]["token_logprobs"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_client_gets_what_vllm_alone_returns_and_the_record_is_exact(
    proxy: RunningCollector, engines: dict[str, EngineServer], api: Harness, case: str, stream: bool
):
    endpoint, body = CASES[case]
    body = {**body, "stream": stream}
    request_id = f"t-{case}-{'s' if stream else 'w'}-{api.backend}"
    status, headers, through = call(proxy.url, endpoint, body, {"X-Request-ID": request_id})
    assert status == 200 and headers["x-request-id"] == request_id
    _, _, alone = call(engines["strict"].url, endpoint, body)
    assert stable(through) == stable(alone)
    if "multibyte" in case:
        # Byte pieces of split characters among the alternatives: vLLM shows them repaired
        # (here: "" where the character is incomplete), and so does the collector.
        assert "" in shown_alternatives(through)

    record = wait_for_record(api, request_id)
    expected = reference(engines["strict"], endpoint, body)
    prompt_ids = expected.get("prompt_token_ids") or expected["choices"][0]["prompt_token_ids"]
    assert ints(record["prompt_token_ids"]) == prompt_ids
    assert record["endpoint"] == endpoint and record["pool"] == "strict"
    assert record["fingerprint_id"] == proxy.collector.state.fingerprint_id
    assert record["system_fingerprint"] == expected["system_fingerprint"]
    assert len(record["choices"]) == len(expected["choices"])
    for got, want in zip(record["choices"], expected["choices"], strict=True):
        assert ints(got["token_ids"]) == want["token_ids"]
        assert float_bits(got["logprobs"]) == f32_bits(engine_logprobs(endpoint, want))
        assert got["finish_reason"] == want["finish_reason"]
    assert record["usage"]["completion_tokens"] == sum(
        len(c["token_ids"]) for c in expected["choices"]
    )
    assert record["request"]["return_token_ids"] is True
    assert json.loads(base64.b64decode(record["request_raw"])) == record["request"]
    if endpoint == "/v1/chat/completions":
        k = body.get("top_logprobs", 0) if body.get("logprobs") else 0
    else:
        k = body.get("logprobs") or 0
    if not k:
        assert all("top_logprobs" not in c for c in record["choices"])
        assert "return_tokens_as_token_ids" not in record["request"]
    else:
        assert record["request"]["return_tokens_as_token_ids"] is True
        rows_per_choice = engine_alternatives(engines["strict"], endpoint, body)
        for got, rows in zip(record["choices"], rows_per_choice, strict=True):
            assert got["top_logprobs"]["k"] == k
            ids = ints(got["top_logprobs"]["token_ids"])
            bits = float_bits(got["top_logprobs"]["logprobs"])
            assert len(ids) == len(bits) // 4 == len(rows) * k
            for pos, row in enumerate(rows):
                kept = ids[pos * k : (pos + 1) * k]
                values = [row[t] for t in kept]  # KeyError: an ID the engine did not list
                assert bits[pos * k * 4 : (pos + 1) * k * 4] == f32_bits(values)
                assert values == sorted(values, reverse=True)
                assert all(row[t] <= values[-1] for t in set(row) - set(kept))
    timings = record["timings"]
    assert 0 < int(timings["ttft_ns"]) <= int(timings["total_ns"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("stop", ["token", "string"])
def test_the_stop_reason_is_recorded(
    proxy: RunningCollector, engines: dict[str, EngineServer], api: Harness, stop: str, stream: bool
):
    # Stop on something the greedy answer holds: its third token, or two characters of it.
    plain = reference(engines["strict"], "/v1/completions", COMPLETION)["choices"][0]
    if stop == "token":
        value: int | str = plain["token_ids"][2]
        body = {**COMPLETION, "stop_token_ids": [value], "stream": stream}
    else:
        middle = len(plain["text"]) // 2
        value = plain["text"][middle : middle + 2]
        assert len(value) == 2
        body = {**COMPLETION, "stop": [value], "stream": stream}
    request_id = f"stop-{stop}-{'s' if stream else 'w'}-{api.backend}"
    status, _, through = call(proxy.url, "/v1/completions", body, {"X-Request-ID": request_id})
    _, _, alone = call(engines["strict"].url, "/v1/completions", body)
    assert status == 200 and stable(through) == stable(alone)
    want = reference(engines["strict"], "/v1/completions", body)["choices"][0]
    assert want["finish_reason"] == "stop" and want["stop_reason"] == value
    (got,) = wait_for_record(api, request_id)["choices"]
    assert (got["finish_reason"], got["stop_reason"]) == ("stop", value)
    assert ints(got["token_ids"]) == want["token_ids"]


def test_models_pass_through_and_metrics_are_the_collectors(
    proxy: RunningCollector, engines: dict[str, EngineServer]
):
    models = httpx.get(f"{proxy.url}/v1/models").json()
    assert models["data"][0]["id"] == "fixture"
    metrics = httpx.get(f"{proxy.url}/metrics").text
    assert "collector_records_spooled_total" in metrics
    assert "collector_added_latency_seconds_bucket" in metrics


def test_engine_errors_pass_through_unchanged(
    proxy: RunningCollector, engines: dict[str, EngineServer]
):
    bad = {"model": "no-such-model", "prompt": "x", "max_tokens": 2}
    status, headers, through = call(proxy.url, "/v1/completions", bad, {"X-Request-ID": "bad-1"})
    alone_status, _, alone = call(engines["strict"].url, "/v1/completions", bad)
    assert (status, through) == (alone_status, alone) and status == 404
    assert headers["x-request-id"] == "bad-1"
    assert proxy.collector.spool.holds("bad-1") is False
    not_json = httpx.post(
        f"{proxy.url}/v1/completions", content=b"{", headers={"content-type": "application/json"}
    )
    assert not_json.status_code >= 400
    # Top-k logprobs without logprobs: vLLM refuses it; the collector must not make it valid
    # by asking for the logprobs its record needs.
    top_k_alone = {**CHAT, "top_logprobs": 2}
    status, _, through = call(proxy.url, "/v1/chat/completions", top_k_alone)
    alone_status, _, alone = call(engines["strict"].url, "/v1/chat/completions", top_k_alone)
    assert (status, through) == (alone_status, alone) and status == 400
    metrics = httpx.get(f"{proxy.url}/metrics").text
    assert 'collector_engine_errors_total{status="404"}' in metrics
    assert 'collector_engine_errors_total{status="400"}' in metrics


def test_refusals_name_the_problem(proxy: RunningCollector):
    status, _, out = call(proxy.url, "/v1/completions", COMPLETION, {"X-Request-ID": "has spaces"})
    assert status == 400 and out["error"]["code"] == "invalid_request_id"
    many = {**COMPLETION, "prompt": ["a", "b"]}
    status, headers, out = call(proxy.url, "/v1/completions", many, {"X-Request-ID": "many-1"})
    assert status == 400 and out["error"]["code"] == "one_prompt_per_request"
    assert headers["x-request-id"] == "many-1"  # the collector's own answers carry it too
    status, headers, _ = call(proxy.url, "/v1/completions", many)
    assert headers["x-request-id"].startswith("req-")


def test_the_openai_client_works_unchanged(proxy: RunningCollector, api: Harness):
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused")
    raw = client.completions.with_raw_response.create(
        model="fixture", prompt="Hello", max_tokens=4, temperature=0
    )
    completion = raw.parse()
    assert completion.choices[0].finish_reason == "length"
    request_id = raw.headers["x-request-id"]
    record = wait_for_record(api, request_id)
    assert len(ints(record["choices"][0]["token_ids"])) == 4
    pieces = []
    for chunk in client.chat.completions.create(
        model="fixture",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        stream=True,
        extra_headers={"X-Request-ID": f"openai-stream-{api.backend}"},
    ):
        pieces.extend(c.delta.content or "" for c in chunk.choices)
    record = wait_for_record(api, f"openai-stream-{api.backend}")
    assert record["choices"][0]["text"] == "".join(pieces)


@pytest.mark.parametrize(
    ("tier", "extra", "missing"),
    [
        ("2", {"temperature": 0}, None),
        ("2", {"temperature": 0.7, "seed": 11}, None),
        ("2", {"temperature": 0.7}, "temperature 0, or a seed"),
        ("1", {"temperature": 0.7, "seed": 11}, None),
        ("1", {"temperature": 0.7}, "temperature 0, or a seed"),
        ("0", {"temperature": 0.7}, None),
        ("9", {"temperature": 0}, "invalid_tier"),
    ],
)
def test_tier_policy_on_the_strict_pool(
    proxy: RunningCollector, api: Harness, tier: str, extra: dict, missing: str | None
):
    request_id = f"tier-{tier}-{uuid.uuid4().hex}"
    body = {**COMPLETION, **extra}
    headers = {"X-Request-ID": request_id, "X-Reproducibility-Tier": tier}
    status, _, out = call(proxy.url, "/v1/completions", body, headers)
    if missing is None:
        assert status == 200
        assert wait_for_record(api, request_id)["tier"] == int(tier)
    elif missing == "invalid_tier":
        assert status == 400 and out["error"]["code"] == "invalid_tier"
    else:
        assert status == 409 and out["error"]["code"] == "tier_refused"
        assert any(missing in m for m in out["error"]["details"]["missing"])
        assert not proxy.collector.spool.holds(request_id)


def test_tier_2_needs_a_batch_invariant_worker(
    engines: dict[str, EngineServer], api: Harness, tmp_path: Path
):
    running = start_collector(engines["default"], api, tmp_path, pool="default")
    try:
        assert running.collector.state.batch_invariance == "none"
        headers = {"X-Reproducibility-Tier": "2"}
        status, _, out = call(running.url, "/v1/completions", COMPLETION, headers)
        assert status == 409
        assert "batch-invariant worker" in out["error"]["message"]
        headers["X-Reproducibility-Tier"] = "1"
        status, response_headers, _ = call(running.url, "/v1/completions", COMPLETION, headers)
        assert status == 200
        record = wait_for_record(api, response_headers["x-request-id"])
        assert record["tier"] == 1 and record["pool"] == "default"
    finally:
        running.close()


def test_a_request_id_in_flight_is_refused_to_a_second_request(
    proxy: RunningCollector, api: Harness
):
    # A client retrying under the same X-Request-ID while its first request still streams:
    # the second is refused before the engine runs, not after its answer went out.
    request_id = f"twice-{uuid.uuid4().hex}"
    body = {**COMPLETION, "max_tokens": 48, "ignore_eos": True, "stream": True}
    headers = {"X-Request-ID": request_id}
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{proxy.url}/v1/completions", json=body, headers=headers) as first,
    ):
        lines = first.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # under way
        status, _, out = call(proxy.url, "/v1/completions", body, headers)
        assert status == 409 and out["error"]["code"] == "request_id_in_use"
        assert "data: [DONE]" in list(lines)
    record = wait_for_record(api, request_id)
    assert record.get("aborted") is None and len(ints(record["choices"][0]["token_ids"])) == 48
    status, _, out = call(proxy.url, "/v1/completions", body, headers)  # recorded: still used
    assert status == 409 and out["error"]["code"] == "request_id_in_use"
    assert proxy.collector.state.in_flight == set()


def test_a_client_that_leaves_mid_stream_still_leaves_an_aborted_record(
    proxy: RunningCollector, api: Harness
):
    request_id = f"aborted-{uuid.uuid4().hex}"
    body = {**COMPLETION, "max_tokens": 200, "ignore_eos": True, "stream": True}
    registry = proxy.collector.state.metrics.registry
    labels = {"endpoint": "/v1/completions", "outcome": "aborted"}
    aborted_before = registry.get_sample_value("collector_requests_total", labels) or 0
    seen = 0
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST", f"{proxy.url}/v1/completions", json=body, headers={"X-Request-ID": request_id}
        ) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen == 3:
                break  # hang up with most of the answer still to come
    record = wait_for_record(api, request_id)
    assert record["aborted"] is True
    assert proxy.collector.state.in_flight == set()
    # Counted as the spool holds it: one more aborted exchange.
    assert registry.get_sample_value("collector_requests_total", labels) == aborted_before + 1
    generated = len(ints(record["choices"][0]["token_ids"]))
    assert 0 < generated < 200
    assert len(float_bits(record["choices"][0]["logprobs"])) == 4 * generated


def _mismatches(proxy: RunningCollector) -> float:
    for line in httpx.get(f"{proxy.url}/metrics").text.splitlines():
        if line.startswith("collector_system_fingerprint_mismatches_total "):
            return float(line.split()[1])
    raise AssertionError("no collector_system_fingerprint_mismatches_total metric")


def test_each_responses_system_fingerprint_is_checked_against_the_engines(
    proxy: RunningCollector,
):
    """The engine answers what it answered when fingerprinted: no mismatch. An engine that
    answers something else (here: the expectation changed under it, as when the engine was
    reconfigured behind the collector's back) is counted on every response, and still
    recorded with what it answered."""
    state = proxy.collector.state
    expected = state.expected_system_fingerprint
    assert expected is not None and expected.startswith("vllm-")
    assert expected == proxy.collector.snapshot.body["engine"]["system_fingerprint"]
    body = {"model": "fixture", "prompt": "Hello", "max_tokens": 2, "temperature": 0}
    before = _mismatches(proxy)
    status, _, answer = call(proxy.url, "/v1/completions", body)
    assert status == 200 and answer["system_fingerprint"] == expected
    assert _mismatches(proxy) == before
    state.expected_system_fingerprint = proxy.collector.snapshot.fingerprint_id
    try:
        for stream in (False, True):
            status, _, _ = call(proxy.url, "/v1/completions", {**body, "stream": stream})
            assert status == 200
    finally:
        state.expected_system_fingerprint = expected
    assert _mismatches(proxy) == before + 2
