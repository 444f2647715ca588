"""Through the collector, a vLLM server started with ``--api-key`` turns away exactly whom it
turns away alone (real vLLM CPU, tiny model).

vLLM checks the key before anything else on ``/v1`` paths, and its 401 carries no CORS
headers. The collector's own refusals (a request ID already used, a bad tier header, several
prompts, a path it does not serve) come before it forwards anything, so without care they
would tell a client vLLM turns away what vLLM never would, and let a browser read it. Each
case sends the same request to vLLM alone and through the collector and compares status,
body and the CORS, Vary and Allow headers; nothing turned away is recorded.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.differential import (
    Answer,
    CollectorUnderTest,
    body_of,
    running_collector,
    send,
)
from tests.support.engine import ALLOWED_ORIGIN, STRICT_ARGS, EngineServer, engine_python

pytestmark = pytest.mark.engine
KEY = "sk-engine-key"
COMPLETIONS = "/v1/completions"
BASE = {"model": "fixture", "prompt": "The ledger keeps", "max_tokens": 3, "temperature": 0}
JSON = {"content-type": "application/json"}
ORIGIN = {"origin": ALLOWED_ORIGIN}
GOOD = {"authorization": f"Bearer {KEY}"}
WRONG = {"authorization": "Bearer guessed"}


@pytest.fixture(scope="module")
def keyed(
    fixture_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineServer]:
    log = tmp_path_factory.mktemp("engine-logs") / "keyed.log"
    args = (*STRICT_ARGS, "--api-key", KEY, "--allowed-origins", json.dumps([ALLOWED_ORIGIN]))
    server = EngineServer(fixture_models["tiny"], args, log, engine_python()).start()
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def collector(
    keyed: EngineServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CollectorUnderTest]:
    with running_collector(keyed.url, keyed.model_dir, tmp_path_factory.mktemp("spool")) as running:
        yield running


def _both(
    keyed: EngineServer,
    collector: CollectorUnderTest,
    method: str,
    path: str,
    headers: dict[str, str],
    body: dict[str, object] | None,
) -> tuple[Answer, Answer]:
    raw = body_of(body) if body is not None else None
    return (
        send(keyed.url, path, raw, headers, method),
        send(collector.url, path, raw, headers, method),
    )


@pytest.fixture(scope="module")
def used(collector: CollectorUnderTest) -> str:
    """A request ID a client with the key has used through the collector."""
    request_id = f"used-{uuid.uuid4().hex[:8]}"
    answer = httpx.post(
        collector.url + COMPLETIONS,
        content=body_of(BASE),
        headers={**JSON, **GOOD, "x-request-id": request_id},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return request_id


REFUSALS = [
    ("POST", COMPLETIONS, {"x-reproducibility-tier": "9"}, BASE),  # invalid_tier
    ("POST", COMPLETIONS, {"x-request-id": ".."}, BASE),  # invalid_request_id
    ("POST", COMPLETIONS, {}, {**BASE, "prompt": ["a", "b"]}),  # one_prompt_per_request
    ("POST", "/v1/responses", {}, {"model": "fixture", "input": "x"}),  # not served here
    ("POST", COMPLETIONS + "/", {}, BASE),  # the collector's redirect
]


@pytest.mark.parametrize("credentials", [{}, WRONG], ids=["none", "wrong"])
@pytest.mark.parametrize("origin", [{}, ORIGIN], ids=["plain", "browser"])
@pytest.mark.parametrize(("method", "path", "extra", "body"), REFUSALS)
def test_a_client_vllm_turns_away_gets_vllms_401_not_the_collectors_refusal(
    keyed: EngineServer,
    collector: CollectorUnderTest,
    method: str,
    path: str,
    extra: dict[str, str],
    body: dict[str, object],
    origin: dict[str, str],
    credentials: dict[str, str],
):
    spooled = collector.state.spool.pending()
    alone, through = _both(
        keyed, collector, method, path, {**JSON, **origin, **credentials, **extra}, body
    )
    assert alone.status == 401 and json.loads(alone.body) == {"error": "Unauthorized"}
    assert (through.status, json.loads(through.body), through.passed) == (
        alone.status,
        json.loads(alone.body),
        alone.passed,
    )
    assert not [k for k in through.passed if k.startswith("access-control-")]
    assert collector.state.spool.pending() == spooled


@pytest.mark.parametrize("credentials", [{}, WRONG], ids=["none", "wrong"])
def test_a_used_request_id_is_no_one_elses_to_learn(
    keyed: EngineServer, collector: CollectorUnderTest, used: str, credentials: dict[str, str]
):
    """Without the key, a request ID used before gets vLLM's 401, as a fresh one does: the
    collector's 409 ``request_id_in_use`` is only for clients vLLM lets in."""
    headers = {**JSON, **ORIGIN, **credentials, "x-request-id": used}
    alone, through = _both(keyed, collector, "POST", COMPLETIONS, headers, BASE)
    assert (through.status, through.body, through.passed) == (
        alone.status,
        alone.body,
        alone.passed,
    )
    assert through.status == 401
    again = httpx.post(
        collector.url + COMPLETIONS,
        content=body_of(BASE),
        headers={**headers, **GOOD},
        timeout=60,
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "request_id_in_use"
    assert again.headers["access-control-allow-origin"] == ALLOWED_ORIGIN


def test_with_the_key_the_collectors_own_answers_carry_vllms_cors_headers(
    keyed: EngineServer, collector: CollectorUnderTest
):
    """A client with the key gets the collector's refusal, readable by the browser as vLLM's
    answers are; vLLM's own answers (its 401 included) pass with their headers as they came."""
    headers = {**JSON, **ORIGIN, **GOOD, "x-reproducibility-tier": "9"}
    _, through = _both(keyed, collector, "POST", COMPLETIONS, headers, BASE)
    models, _ = _both(keyed, collector, "GET", "/v1/models", {**ORIGIN, **GOOD}, None)
    assert through.status == 400 and json.loads(through.body)["error"]["code"] == "invalid_tier"
    wanted = {k: v for k, v in models.passed.items() if k != "allow"}
    assert wanted["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert through.passed == wanted
    alone, passed = _both(keyed, collector, "GET", "/v1/models", ORIGIN, None)
    assert alone.status == 401 and (passed.status, passed.passed) == (401, alone.passed)
    metrics = httpx.get(collector.url + "/metrics", headers=ORIGIN, timeout=60)
    assert metrics.status_code == 200  # not a path vLLM's key check guards
    assert metrics.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
