"""The LangChain and LiteLLM cache backends, with the real libraries, against a real ledger over
HTTP (synthetic signed records) and a stand-in OpenAI server that records every body the library
sends, so a test sees both what the library would send and whether it sent anything.

The records are written the way a collector writes them: their request is the body the library
sent (captured), their answer a text the stand-in never gives, so a hit is told from a call."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import

import litellm
from langchain_core.caches import BaseCache
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI, OpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from client.cache_backends.langchain import LedgerCache
from client.cache_backends.litellm import LedgerLiteLLMCache
from client.cache_backends.lookup import CHAT, COMPLETIONS, LedgerLookup
from demo.server_thread import ServerThread, free_port
from ledger.errors import InvalidInput
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.records import RECORD_KIND, Choice, build_record_body
from ledger.signing import SigningKey, sign_envelope
from tests.support.harness import Harness
from tests.support.workers import heartbeat, post_heartbeat, serial_engine

LIVE = "live answer"  # what the stand-in server answers; a record never holds it
DELIVERY_ONLY = ("stream", "stream_options")


# -- a stand-in OpenAI server that keeps every body ---------------------------------------


@dataclass
class OpenAIStandIn:
    bodies: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    server: ServerThread | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url + "/v1"

    def last(self) -> dict[str, Any]:
        return self.bodies[-1][1]

    async def _answer(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.bodies.append((request.url.path, body))
        chat = request.url.path.endswith("/chat/completions")
        n = int(body.get("n") or 1)
        head = {"id": "x-1", "created": 1, "model": body.get("model")}
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        if not body.get("stream"):
            if chat:
                choices = [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": LIVE},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                    for i in range(n)
                ]
                answer = {**head, "object": "chat.completion", "choices": choices}
            else:
                choices = [
                    {"index": i, "text": LIVE, "logprobs": None, "finish_reason": "stop"}
                    for i in range(n)
                ]
                answer = {**head, "object": "text_completion", "choices": choices}
            return JSONResponse({**answer, "usage": usage})
        if chat:
            head["object"] = "chat.completion.chunk"
            events = [
                {
                    **head,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": LIVE}}],
                },
                {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            ]
        else:
            head["object"] = "text_completion"
            events = [
                {**head, "choices": [{"index": 0, "text": LIVE, "finish_reason": None}]},
                {**head, "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
            ]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**head, "choices": [], "usage": usage})
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return Response(text, media_type="text/event-stream")

    def start(self) -> OpenAIStandIn:
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._answer, methods=["POST"]),
                Route("/v1/completions", self._answer, methods=["POST"]),
            ]
        )
        self.server = ServerThread(app, "127.0.0.1", free_port()).start()
        return self


@pytest.fixture(scope="module")
def openai_server() -> Iterator[OpenAIStandIn]:
    server = OpenAIStandIn().start()
    yield server
    assert server.server is not None
    server.server.stop()


# -- a pool on the ledger: a fingerprint, a live worker, a cache:read token ---------------


@dataclass
class Pool:
    api: Harness
    key: SigningKey
    fingerprint_id: str
    name: str
    token: str
    fingerprint: dict[str, Any]
    worker_id: str = field(default_factory=lambda: f"w-{uuid.uuid4().hex[:8]}")

    def live(self) -> None:
        """A heartbeat: the pool's worker is live for the ledger's worker TTL (15 s)."""
        beat = heartbeat(
            self.key,
            worker_id=self.worker_id,
            pool=self.name,
            url="http://127.0.0.1:9",
            fingerprint_id=self.fingerprint_id,
        )
        response = post_heartbeat(self.api, beat)
        assert response.status_code == 200, response.text

    def record(self, endpoint: str, request: dict[str, Any], text: str, n: int = 1) -> str:
        """A signed record of ``request`` answered with ``text``, as a collector ships one."""
        request_id = f"req-{uuid.uuid4().hex}"
        body = build_record_body(
            request_id=request_id,
            fingerprint_id=self.fingerprint_id,
            worker_id=self.worker_id,
            pool=self.name,
            tier=2,
            endpoint=endpoint,
            model=str(request["model"]),
            request=request,
            prompt_token_ids=[11, 12, 13],
            choices=[Choice([21, 22], [-0.5, -0.25], text=text) for _ in range(n)],
            started_at="2026-12-01T09:00:00.000000Z",
            ttft_ns=1_000_000,
            total_ns=2_000_000,
            system_fingerprint="vllm-test",
        )
        response = self.api.post([sign_envelope(RECORD_KIND, body, self.key)])
        assert response.status_code == 201, response.text
        self.live()
        return request_id


def make_pool(api: Harness, model: dict[str, Any] | None = None, max_num_seqs: int = 1) -> Pool:
    """A pool whose one live worker serves a fingerprint of ``model`` (a new model when None)
    on a serial engine with ``max_num_seqs``."""
    key = api.collector()
    body = {
        "schema_version": 1,
        "model": model or {"name": f"m-{uuid.uuid4().hex[:8]}"},
        "engine": {**serial_engine(), "max_num_seqs": max_num_seqs},
    }
    response = api.client().post(
        "/v1/fingerprints", content=sign_envelope(FINGERPRINT_KIND, body, key).canonical
    )
    assert response.status_code == 201, response.text
    fp = response.json()["fingerprint_id"]
    pool = Pool(api, key, fp, f"pool-{uuid.uuid4().hex[:8]}", api.token("cache:read"), body)
    pool.live()
    return pool


@pytest.fixture
def pool(api: Harness) -> Pool:
    return make_pool(api)


@pytest.fixture(scope="module")
def arun() -> Iterator[Callable[[Awaitable[Any]], Any]]:
    """One event loop for the module's async calls: langchain-openai keeps one async HTTP
    client per base URL for the process, and a client belongs to the loop it first ran in."""
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete
    loop.close()


def closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def without_delivery(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in DELIVERY_ONLY}


def unique(text: str) -> str:
    return f"{text} {uuid.uuid4().hex[:6]}"


def test_the_client_package_imports_without_the_libraries() -> None:
    """Only the two backend modules import LangChain or LiteLLM."""
    blocked = ["langchain_core", "langchain_openai", "litellm"]
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({blocked!r}));"
        "import client, client.ledger_client, client.cache_backends, client.cache_backends.lookup"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


# -- LangChain ----------------------------------------------------------------------------


class Spy(BaseCache):
    """A LangChain cache that only keeps what LangChain asks it."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def lookup(self, prompt: str, llm_string: str) -> None:
        self.asked.append((prompt, llm_string))

    def update(self, prompt: str, llm_string: str, return_val: Any) -> None:
        pass

    def clear(self, **kwargs: Any) -> None:
        pass


CHAT_MODELS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0, "max_tokens": 12},
    "sampling": {
        "temperature": 0.7,
        "seed": 11,
        "top_p": 0.9,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "n": 2,
        "stop": ["\n\n"],
    },
    "vllm-extras": {
        "temperature": 0,
        "extra_body": {"top_k": 4, "min_p": 0.05, "repetition_penalty": 1.1},
        "model_kwargs": {"user": "alice"},
        "logit_bias": {"42": -5},
    },
    "streaming": {"temperature": 0, "streaming": True, "stream_usage": True, "max_tokens": 5},
}
CONVERSATION = [
    SystemMessage("You keep records."),
    HumanMessage("What is a ledger?"),
    AIMessage("A book of accounts."),
    HumanMessage("And a log?", name="bob"),
]


@pytest.mark.parametrize("config", list(CHAT_MODELS), ids=list(CHAT_MODELS))
def test_the_chat_request_is_the_one_chat_openai_sends(
    openai_server: OpenAIStandIn, config: str, arun: Callable[[Awaitable[Any]], Any]
) -> None:
    spy = Spy()
    model = ChatOpenAI(
        model="fixture", base_url=openai_server.url, api_key="k", cache=spy, **CHAT_MODELS[config]
    )
    cache = LedgerCache(closed_url(), "t", pool="p")
    for call in (
        lambda m: m.invoke(CONVERSATION),
        lambda m: m.invoke("Hello", stop=["."]),
        lambda m: m.bind(max_tokens=3, stop=["x", "y"]).invoke("Hi"),
        lambda m: arun(m.ainvoke("Hi again")),
    ):
        call(model)
        rebuilt = cache.request_for(*spy.asked[-1])
        assert rebuilt is not None and rebuilt.endpoint == CHAT
        # the body sent, but for how it is delivered (stream_options is added when streaming)
        assert without_delivery(rebuilt.request) == without_delivery(openai_server.last())
        assert openai_server.bodies[-1][0] == "/v1/chat/completions"


def test_the_completion_request_is_the_one_openai_llm_sends(openai_server: OpenAIStandIn) -> None:
    spy = Spy()
    llm = OpenAI(
        model="fixture",
        base_url=openai_server.url,
        api_key="k",
        cache=spy,
        temperature=0,
        max_tokens=7,
        top_p=0.5,
        logit_bias={"7": 1},
        extra_body={"top_k": 3},
    )
    cache = LedgerCache(closed_url(), "t", pool="p", completion_llms=True)
    for stop in (None, ["."]):
        llm.invoke("Once upon a time", stop=stop)
        rebuilt = cache.request_for(*spy.asked[-1])
        sent = openai_server.last()
        assert sent["prompt"] == ["Once upon a time"]  # LangChain sends a batch of one
        assert rebuilt is not None and rebuilt.endpoint == COMPLETIONS
        assert rebuilt.request == {**sent, "prompt": "Once upon a time"}
    assert LedgerCache(closed_url(), "t", pool="p").request_for(*spy.asked[-1]) is None  # opt-in


def test_what_cannot_be_rebuilt_is_no_request() -> None:
    cache = LedgerCache(closed_url(), "t", pool="p")
    spy = Spy()
    FakeListChatModel(responses=["fake"], cache=spy).invoke("Hi")
    assert cache.request_for(*spy.asked[-1]) is None  # another model class
    assert cache.request_for("[]", '{"id": ["x"]}---nonsense(') is None
    assert cache.request_for("Hi", "{not json") is None
    assert cache.request_for("Hi", "[('_type', 'azure'), ('model_name', 'x')]") is None
    assert cache.request_for("Hi", "[('_type', 'openai'), ('model_name', object())]") is None
    with pytest.raises(InvalidInput, match="one of them"):
        LedgerCache(closed_url(), "t")
    with pytest.raises(InvalidInput, match="one of them"):
        LedgerCache(closed_url(), "t", pool="p", fingerprint_id="sha256:" + "0" * 64)
    # a model that is no OpenAI model asks and is answered by itself
    assert FakeListChatModel(responses=["fake"], cache=cache).invoke("Hi").content == "fake"


def test_a_chat_model_is_answered_from_the_ledger(
    pool: Pool, openai_server: OpenAIStandIn, arun: Callable[[Awaitable[Any]], Any]
) -> None:
    cache = LedgerCache(pool.api.url, pool.token, pool=pool.name)
    model = ChatOpenAI(
        model="fixture", base_url=openai_server.url, api_key="k", temperature=0, cache=cache
    )
    question = unique("What is a ledger?")
    assert model.invoke(question).content == LIVE  # a miss: the model answers
    request_id = pool.record(CHAT, openai_server.last(), "A signed log of answers.")
    calls = len(openai_server.bodies)
    hit = model.invoke(question)
    assert hit.content == "A signed log of answers."
    assert hit.response_metadata["ledger"]["request_id"] == request_id
    assert hit.response_metadata["finish_reason"] == "stop"
    assert arun(model.ainvoke(question)).content == "A signed log of answers."
    # a streaming model is looked up the same way (stream is no part of the key)
    streaming = ChatOpenAI(
        model="fixture",
        base_url=openai_server.url,
        api_key="k",
        temperature=0,
        cache=cache,
        streaming=True,
    )
    assert streaming.invoke(question).content == "A signed log of answers."
    assert len(openai_server.bodies) == calls  # no call reached the model
    # another question is another key
    assert model.invoke(unique("What is a log?")).content == LIVE


def test_a_completion_llm_is_answered_from_the_ledger(
    pool: Pool, openai_server: OpenAIStandIn, arun: Callable[[Awaitable[Any]], Any]
) -> None:
    cache = LedgerCache(
        pool.api.url, pool.token, fingerprint_id=pool.fingerprint_id, completion_llms=True
    )
    llm = OpenAI(
        model="fixture",
        base_url=openai_server.url,
        api_key="k",
        temperature=0,
        max_tokens=5,
        cache=cache,
    )
    prompt = unique("Once upon a time")
    assert llm.invoke(prompt) == LIVE
    # recorded as a client sends one prompt (LangChain sends a list of one: see the module)
    pool.record(COMPLETIONS, {**openai_server.last(), "prompt": prompt}, " there was a log")
    calls = len(openai_server.bodies)
    assert llm.invoke(prompt) == " there was a log"
    assert arun(llm.ainvoke(prompt)) == " there was a log"
    assert len(openai_server.bodies) == calls
    # without the opt-in a completion LLM is never looked up: its per-call arguments are not
    # in what LangChain gives a cache, so a hit could answer another request
    guarded = OpenAI(
        model="fixture",
        base_url=openai_server.url,
        api_key="k",
        temperature=0,
        max_tokens=5,
        cache=LedgerCache(pool.api.url, pool.token, fingerprint_id=pool.fingerprint_id),
    )
    assert guarded.invoke(prompt, temperature=0.9) == LIVE
    assert len(openai_server.bodies) == calls + 1


def test_sampling_without_a_seed_is_never_a_hit(
    pool: Pool, openai_server: OpenAIStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    cache = LedgerCache(pool.api.url, pool.token, pool=pool.name)
    question = unique("Tell me a story")
    sampled = ChatOpenAI(
        model="fixture", base_url=openai_server.url, api_key="k", temperature=0.7, cache=cache
    )
    sampled.invoke(question)
    pool.record(CHAT, openai_server.last(), "a story")
    calls = len(openai_server.bodies)
    with caplog.at_level(logging.DEBUG, logger="client.cache_backends"):
        assert sampled.invoke(question).content == LIVE
    assert len(openai_server.bodies) == calls + 1
    assert "not_deterministic" in caplog.text
    # seeded sampling is reproducible: a hit
    seeded = ChatOpenAI(
        model="fixture",
        base_url=openai_server.url,
        api_key="k",
        temperature=0.7,
        seed=5,
        cache=cache,
    )
    seeded.invoke(question)
    pool.record(CHAT, openai_server.last(), "a seeded story")
    assert seeded.invoke(question).content == "a seeded story"


def test_a_ledger_that_cannot_answer_is_a_miss_with_a_warning(
    pool: Pool,
    openai_server: OpenAIStandIn,
    caplog: pytest.LogCaptureFixture,
    arun: Callable[[Awaitable[Any]], Any],
) -> None:
    question = unique("Are you there?")
    for cache, expected in (
        (LedgerCache(closed_url(), pool.token, pool=pool.name), "cannot reach the ledger"),
        (LedgerCache(pool.api.url, "not-a-token", pool=pool.name), "HTTP 401"),
        (LedgerCache(pool.api.url, pool.token, pool="no-such-pool"), "HTTP 404"),
    ):
        model = ChatOpenAI(
            model="fixture", base_url=openai_server.url, api_key="k", temperature=0, cache=cache
        )
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="client.cache_backends"):
            assert model.invoke(question).content == LIVE
            assert arun(model.ainvoke(question)).content == LIVE
        assert caplog.text.count(expected) == 2, caplog.text


def test_a_pool_serving_another_fingerprint_misses(
    pool: Pool, api: Harness, openai_server: OpenAIStandIn
) -> None:
    model = ChatOpenAI(model="fixture", base_url=openai_server.url, api_key="k", temperature=0)
    model.invoke(unique("Same question"))
    request = openai_server.last()
    pool.record(CHAT, request, "answered under the first fingerprint")
    here = LedgerLookup(api.url, pool.token, pool=pool.name)
    assert here.lookup(CHAT, request).hit
    # a pool whose workers serve the same model in another environment (another engine flag)
    moved = make_pool(api, model=pool.fingerprint["model"], max_num_seqs=8)
    answer = LedgerLookup(api.url, pool.token, pool=moved.name).lookup(CHAT, request)
    assert not answer.hit and answer.reason == "fingerprint_changed"
    assert answer.fingerprint_id == moved.fingerprint_id
    # a request naming another model than the record answered is no hit either: the ledger
    # compares it with the recorded request's (the backends' model_mismatch is the second check)
    other = here.lookup(CHAT, {**request, "model": "other-model"})
    assert not other.hit and other.reason == "not_servable"


# -- LiteLLM ------------------------------------------------------------------------------


@pytest.fixture
def litellm_cache(pool: Pool) -> Iterator[LedgerLiteLLMCache]:
    cache = LedgerLiteLLMCache(pool.api.url, pool.token, pool=pool.name)
    litellm.cache = cache
    try:
        yield cache
    finally:
        litellm.disable_cache()
        cache.ledger.close()


def chat_call(server: OpenAIStandIn, question: str, **kw: Any) -> dict[str, Any]:
    return {
        "model": "hosted_vllm/fixture",
        "api_base": server.url,
        "messages": [{"role": "user", "content": question}],
        **kw,
    }


def test_the_litellm_request_is_the_one_litellm_sends(openai_server: OpenAIStandIn) -> None:
    cache = LedgerLiteLLMCache(closed_url(), "t", pool="p")
    calls = [
        (litellm.completion, CHAT, chat_call(openai_server, "Hi", temperature=0, max_tokens=4)),
        (
            litellm.completion,
            CHAT,
            chat_call(
                openai_server,
                "Hi",
                temperature=0.5,
                seed=3,
                stop=["\n"],
                top_k=5,
                extra_body={"min_p": 0.1},
                n=2,
            ),
        ),
        (
            litellm.completion,
            CHAT,
            {
                **chat_call(openai_server, "Hi", temperature=0),
                "model": "openai/fixture",
                "api_key": "k",
                "extra_body": {"top_k": 2},
            },
        ),
        (
            litellm.text_completion,
            COMPLETIONS,
            {
                "model": "hosted_vllm/fixture",
                "api_base": openai_server.url,
                "prompt": "Once",
                "temperature": 0,
                "max_tokens": 3,
                "extra_body": {"top_k": 2},
            },
        ),
        (
            litellm.text_completion,
            COMPLETIONS,
            {
                "model": "text-completion-openai/fixture",
                "api_base": openai_server.url,
                "api_key": "k",
                "prompt": "Once",
                "temperature": 0,
                "echo": False,
            },
        ),
    ]
    first = len(openai_server.bodies)
    for function, endpoint, kwargs in calls:
        function(**kwargs)
        assert cache.request_for(**kwargs) == (endpoint, openai_server.last())
        assert openai_server.bodies[-1][0] == endpoint
    handle = cache.get_cache_key(**calls[0][2])
    assert handle.startswith("ledger:")
    assert cache.kept(handle) == (CHAT, openai_server.bodies[first][1])
    # not OpenAI-compatible HTTP, or not a completion: no request, a handle the backend misses
    anthropic = {"model": "anthropic/claude-x", "messages": [{"role": "user", "content": "Hi"}]}
    assert cache.request_for(**anthropic) is None
    assert cache.kept(cache.get_cache_key(**anthropic)) is None
    assert cache.request_for(model="hosted_vllm/fixture", input=["x"]) is None
    assert cache.request_for(**chat_call(openai_server, "Hi"), text_completion=True) is None


def test_litellm_completion_is_answered_from_the_ledger(
    pool: Pool,
    openai_server: OpenAIStandIn,
    litellm_cache: LedgerLiteLLMCache,
    arun: Callable[[Awaitable[Any]], Any],
) -> None:
    call = chat_call(openai_server, unique("What is a ledger?"), temperature=0, max_tokens=6)
    first = litellm.completion(**call)
    assert first.choices[0].message.content == LIVE
    pool.record(CHAT, openai_server.last(), "A signed log of answers.")
    calls = len(openai_server.bodies)
    hit = litellm.completion(**call)
    assert isinstance(hit, litellm.ModelResponse)
    assert hit.choices[0].message.content == "A signed log of answers."
    assert hit._hidden_params.get("cache_hit") is True
    assert hit.usage.completion_tokens == 2
    again = arun(litellm.acompletion(**call))
    assert again.choices[0].message.content == "A signed log of answers."
    chunks = list(litellm.completion(**call, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "A signed log of answers."
    assert len(openai_server.bodies) == calls
    # a long conversation is looked up too (LiteLLM's own default skips more than 4 messages)
    long = chat_call(openai_server, "x", temperature=0)
    long["messages"] = [{"role": "user", "content": f"turn {i}"} for i in range(6)]
    litellm.completion(**long)
    pool.record(CHAT, openai_server.last(), "six turns")
    assert litellm.completion(**long).choices[0].message.content == "six turns"


def test_litellm_keys_every_call_by_its_own_body_whatever_its_call_id(
    pool: Pool, openai_server: OpenAIStandIn, litellm_cache: LedgerLiteLLMCache
) -> None:
    """An application may pass one trace ID as ``litellm_call_id`` to several calls: the
    second question is never answered with the first one's record."""
    trace = f"trace-{uuid.uuid4().hex}"
    first = chat_call(openai_server, unique("First question?"), temperature=0, max_tokens=6)
    litellm.completion(**first, litellm_call_id=trace)
    pool.record(CHAT, openai_server.last(), "the first answer")
    hit = litellm.completion(**first, litellm_call_id=trace)
    assert hit.choices[0].message.content == "the first answer"
    second = chat_call(openai_server, unique("Another question?"), temperature=0, max_tokens=6)
    assert litellm.completion(**second, litellm_call_id=trace).choices[0].message.content == LIVE


def test_litellm_text_completion_is_answered_from_the_ledger(
    pool: Pool,
    openai_server: OpenAIStandIn,
    litellm_cache: LedgerLiteLLMCache,
    arun: Callable[[Awaitable[Any]], Any],
) -> None:
    call = {
        "model": "hosted_vllm/fixture",
        "api_base": openai_server.url,
        "prompt": unique("Once upon a time"),
        "temperature": 0,
        "max_tokens": 5,
    }
    assert litellm.text_completion(**call).choices[0].text == LIVE
    pool.record(COMPLETIONS, openai_server.last(), " there was a log")
    calls = len(openai_server.bodies)
    hit = litellm.text_completion(**call)
    assert isinstance(hit, litellm.TextCompletionResponse)
    assert hit.choices[0].text == " there was a log"
    again = arun(litellm.atext_completion(**call))
    assert again.choices[0].text == " there was a log"
    assert len(openai_server.bodies) == calls


def test_litellm_misses_what_the_ledger_cannot_reuse(
    pool: Pool,
    openai_server: OpenAIStandIn,
    litellm_cache: LedgerLiteLLMCache,
    caplog: pytest.LogCaptureFixture,
    arun: Callable[[Awaitable[Any]], Any],
) -> None:
    call = chat_call(openai_server, unique("Tell me a story"), temperature=0.7)
    litellm.completion(**call)
    pool.record(CHAT, openai_server.last(), "a story")
    calls = len(openai_server.bodies)
    with caplog.at_level(logging.DEBUG, logger="client.cache_backends"):
        assert litellm.completion(**call).choices[0].message.content == LIVE
    assert "not_deterministic" in caplog.text
    assert len(openai_server.bodies) == calls + 1
    # the ledger down: a warning, and the call goes to the model
    litellm.cache = LedgerLiteLLMCache(closed_url(), pool.token, pool=pool.name)
    greedy = chat_call(openai_server, unique("Anyone?"), temperature=0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="client.cache_backends"):
        assert litellm.completion(**greedy).choices[0].message.content == LIVE
        assert arun(litellm.acompletion(**greedy)).choices[0].message.content == LIVE
    assert caplog.text.count("cannot reach the ledger") == 2
