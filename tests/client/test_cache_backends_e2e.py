"""The cache backends end to end on real vLLM CPU: a deterministic request through a collector is
recorded; the same request asked through LangChain (``ChatOpenAI`` with ``LedgerCache``) and
LiteLLM (``LedgerLiteLLMCache``), both pointed at that collector, is answered from the ledger
with the engine's own text, and the engine sees no request (its ``vllm:request_success_total``
does not move). Sampling without a seed is never a hit.

One engine: the session's strict server on the tiny model (``tiny_engine``). A fingerprint
change is shown by a second pool whose live worker serves the same model in another engine
configuration: the engine's own fingerprint with ``max_num_seqs`` 8, signed by a registered
collector key, as a collector before such an engine would register it (the session's
``engines`` has one, ``seqs8``, but starting its four servers is the price of the whole engine
suite, not of this file)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import

import litellm
from langchain_openai import ChatOpenAI

from client.cache_backends.langchain import LedgerCache
from client.cache_backends.litellm import LedgerLiteLLMCache
from client.cache_backends.lookup import CHAT, LedgerLookup
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.signing import sign_envelope
from tests.support.collector import RunningCollector, start_collector, wait_for_record
from tests.support.engine import EngineServer
from tests.support.harness import Harness
from tests.support.workers import heartbeat, post_heartbeat

pytestmark = pytest.mark.engine
MAX_TOKENS = 8


@dataclass
class Pool:
    name: str
    engine: EngineServer
    collector: RunningCollector

    @property
    def base_url(self) -> str:
        return self.collector.url + "/v1"


def _pool(engine: EngineServer, api: Harness, spool: Path, label: str) -> Iterator[Pool]:
    name = f"cache-{label}-{api.backend}-{uuid.uuid4().hex[:6]}"
    running = start_collector(engine, api, spool, pool=name, register=True)
    try:
        deadline = time.monotonic() + 60
        while api.client().get(f"/v1/pools/{name}").json().get("live_workers", 0) < 1:
            assert time.monotonic() < deadline, f"pool {name} has no live worker"
            time.sleep(0.2)
        yield Pool(name, engine, running)
    finally:
        running.close()


@pytest.fixture(scope="module")
def strict(
    tiny_engine: EngineServer, api: Harness, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pool]:
    yield from _pool(tiny_engine, api, tmp_path_factory.mktemp("cache-strict"), "strict")


def sibling_pool(api: Harness, pool: Pool) -> str:
    """A pool whose one live worker serves the model of ``pool``'s fingerprint with
    ``max_num_seqs`` 8: another fingerprint of the same model."""
    admin = api.client()
    (worker,) = admin.get(f"/v1/pools/{pool.name}").json()["workers"]
    logged = admin.get(f"/v1/fingerprints/{worker['fingerprint_id']}").json()["envelope"]["body"]
    body = {**logged, "engine": {**logged["engine"], "max_num_seqs": 8}}
    key = api.collector()
    registered = admin.post(
        "/v1/fingerprints", content=sign_envelope(FINGERPRINT_KIND, body, key).canonical
    )
    assert registered.status_code == 201, registered.text
    name = f"{pool.name}-seqs8"
    beat = heartbeat(
        key,
        worker_id=f"w-{uuid.uuid4().hex[:8]}",
        pool=name,
        url="http://127.0.0.1:9",
        fingerprint_id=registered.json()["fingerprint_id"],
    )
    assert post_heartbeat(api, beat).status_code == 200
    return name


@pytest.fixture(scope="module")
def arun() -> Iterator[Callable[[Awaitable[Any]], Any]]:
    """One event loop for the module: langchain-openai keeps one async HTTP client per base
    URL for the process, and a client belongs to the loop it first ran in."""
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete
    loop.close()


def engine_requests(engine: EngineServer) -> float:
    """Requests the engine has finished: ``vllm:request_success_total``, all reasons."""
    text = httpx.get(f"{engine.url}/metrics", timeout=10).text
    samples = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    ]
    assert samples, "vllm:request_success_total is not in the engine's metrics"
    return sum(samples)


def through_collector(pool: Pool, api: Harness, body: dict[str, Any], tier: int) -> str:
    """``body`` sent to the collector as a plain client would, at reproducibility ``tier`` (a
    cache answer needs 1 or 2; the collector's default is 0); its answer's text, once the
    record is in the ledger."""
    response = httpx.post(
        pool.base_url + "/chat/completions",
        json=body,
        headers={"X-Reproducibility-Tier": str(tier)},
        timeout=300,
    )
    assert response.status_code == 200, response.text
    wait_for_record(api, response.headers["x-request-id"])
    text: str = response.json()["choices"][0]["message"]["content"]
    return text


def question(body: str) -> dict[str, Any]:
    return {
        "model": "fixture",
        "messages": [{"role": "user", "content": f"{body} {uuid.uuid4().hex[:6]}"}],
        "max_tokens": MAX_TOKENS,
    }


def test_a_recorded_answer_serves_langchain_and_litellm_without_the_engine(
    strict: Pool, api: Harness, arun: Callable[[Awaitable[Any]], Any]
) -> None:
    token = api.token("cache:read")
    body = {**question("The ledger keeps"), "temperature": 0}
    text = through_collector(strict, api, body, tier=2)
    content = body["messages"][0]["content"]
    before = engine_requests(strict.engine)

    answer = LedgerLookup(api.url, token, pool=strict.name).lookup(CHAT, body)
    assert answer.hit, answer
    cache = LedgerCache(api.url, token, pool=strict.name)
    chat = ChatOpenAI(
        model="fixture",
        base_url=strict.base_url,
        api_key="none",
        temperature=0,
        max_tokens=MAX_TOKENS,
        cache=cache,
    )
    hit = chat.invoke(content)
    assert hit.content == text
    assert hit.response_metadata["ledger"]["request_id"]
    assert arun(chat.ainvoke(content)).content == text

    litellm.cache = LedgerLiteLLMCache(api.url, token, pool=strict.name)
    try:
        call = {
            "model": "hosted_vllm/fixture",
            "api_base": strict.base_url,
            "messages": body["messages"],
            "temperature": 0,
            "max_tokens": MAX_TOKENS,
        }
        answered = litellm.completion(**call)
        assert answered.choices[0].message.content == text
        assert answered._hidden_params.get("cache_hit") is True
        assert arun(litellm.acompletion(**call)).choices[0].message.content == text
    finally:
        litellm.disable_cache()
    assert engine_requests(strict.engine) == before  # no call reached the engine


def test_sampling_without_a_seed_goes_to_the_engine(strict: Pool, api: Harness) -> None:
    token = api.token("cache:read")
    body = {**question("Tell a story"), "temperature": 0.7}
    through_collector(strict, api, body, tier=0)  # recorded, but no cache answer
    content = body["messages"][0]["content"]
    before = engine_requests(strict.engine)
    chat = ChatOpenAI(
        model="fixture",
        base_url=strict.base_url,
        api_key="none",
        temperature=0.7,
        max_tokens=MAX_TOKENS,
        cache=LedgerCache(api.url, token, pool=strict.name),
    )
    chat.invoke(content)
    litellm.cache = LedgerLiteLLMCache(api.url, token, pool=strict.name)
    try:
        litellm.completion(
            model="hosted_vllm/fixture",
            api_base=strict.base_url,
            messages=body["messages"],
            temperature=0.7,
            max_tokens=MAX_TOKENS,
        )
    finally:
        litellm.disable_cache()
    assert engine_requests(strict.engine) == before + 2
    answer = LedgerLookup(api.url, token, pool=strict.name).lookup(CHAT, body)
    assert not answer.hit and answer.reason == "not_deterministic"


def test_another_fingerprint_of_the_model_misses(strict: Pool, api: Harness) -> None:
    token = api.token("cache:read")
    body = {**question("Same model, other engine"), "temperature": 0}
    through_collector(strict, api, body, tier=2)
    here = LedgerLookup(api.url, token, pool=strict.name).lookup(CHAT, body)
    assert here.hit, here
    moved = sibling_pool(api, strict)
    there = LedgerLookup(api.url, token, pool=moved).lookup(CHAT, body)
    assert not there.hit and there.reason == "fingerprint_changed", there
    assert there.fingerprint_id != here.fingerprint_id
    assert here.fingerprint_id in there.message  # the fingerprint that answered it
    # so LangChain with the moved pool's cache asks the model
    before = engine_requests(strict.engine)
    ChatOpenAI(
        model="fixture",
        base_url=strict.base_url,
        api_key="none",
        temperature=0,
        max_tokens=MAX_TOKENS,
        cache=LedgerCache(api.url, token, pool=moved),
    ).invoke(body["messages"][0]["content"])
    assert engine_requests(strict.engine) == before + 1


@pytest.mark.parametrize("endpoint", ["/completions", "/chat/completions"])
def test_a_hit_is_the_answer_the_client_got_from_vllm(
    strict: Pool, api: Harness, endpoint: str
) -> None:
    """``POST /v1/cache/lookup``'s ``response`` against the answer the client had from vLLM
    through the collector: the same ID, model, text, token IDs, finish reason and usage."""
    body: dict[str, Any] = {"model": "fixture", "max_tokens": MAX_TOKENS, "temperature": 0}
    if endpoint == "/completions":
        body["prompt"] = f"The ledger keeps {uuid.uuid4().hex[:6]}"
    else:
        body["messages"] = question("What is a replay?")["messages"]
    body["return_token_ids"] = True
    sent = httpx.post(
        strict.base_url + endpoint, json=body, headers={"X-Reproducibility-Tier": "1"}, timeout=300
    )
    assert sent.status_code == 200, sent.text
    wait_for_record(api, sent.headers["x-request-id"])
    got = sent.json()
    lookup = api.client(api.token("cache:read")).post(
        "/v1/cache/lookup",
        json={"endpoint": "/v1" + endpoint, "request": body, "pool": strict.name},
    )
    data = lookup.json()
    assert data["hit"] is True, data
    answer = data["response"]
    for field in ("id", "object", "model", "system_fingerprint"):
        assert answer[field] == got[field], field
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert {k: answer["usage"][k] for k in counts} == {k: got["usage"][k] for k in counts}
    (mine,), (theirs,) = answer["choices"], got["choices"]
    for field in ("index", "finish_reason", "stop_reason", "token_ids"):
        assert mine[field] == theirs[field], field
    if endpoint == "/completions":
        assert mine["text"] == theirs["text"]
        assert mine["prompt_token_ids"] == theirs["prompt_token_ids"]
    else:
        assert mine["message"]["content"] == theirs["message"]["content"]
        assert answer["prompt_token_ids"] == got["prompt_token_ids"]
