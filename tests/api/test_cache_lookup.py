"""The one-call cache lookup, ``POST /v1/cache/lookup``, over real HTTP on SQLite and Postgres:
it agrees with the two-call path (``POST /v1/cache/key`` then ``GET /v1/cache/{key}``) on every
case; a hit is vLLM's answer rebuilt from the record (text, token IDs, logprobs where they can
be rebuilt, an SSE stream for a streamed request); a miss says why; a pool resolves to its
live workers' fingerprint; and an answer kept in the process is never served once the index
rows it was verified through change (edited, erased)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from api.app import create_app
from api.body import LOOP_BODY
from api.routes.cache import render_answer
from api.schemas import CacheLookupRequest
from api.settings import Settings
from ledger.cachekey import CHAT, COMPLETIONS
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.packing import unpack_float32, unpack_int32
from ledger.records import RECORD_KIND, Choice, build_record_body
from ledger.signing import SigningKey, sign_envelope
from ledger.storage import cache, cache_lookup, erasures
from ledger.storage.cache_lookup import HotAnswers, answer
from tests.api.test_read_paths import superuser
from tests.conftest import BACKENDS, fresh_url
from tests.support.documents import record_body, record_v2
from tests.support.harness import Harness, start_harness
from tests.support.http import assert_error
from tests.support.workers import heartbeat, post_heartbeat

GREEDY = {"temperature": 0}


def _post(api: Harness, key: SigningKey, *bodies: dict[str, Any]) -> list[tuple[str, int]]:
    envs = [sign_envelope(RECORD_KIND, b, key).to_dict() for b in bodies]
    resp = api.client().post("/v1/records", json={"envelopes": envs})
    assert resp.status_code == 201, resp.text
    return [
        (b["request_id"], r["log_index"])
        for b, r in zip(bodies, resp.json()["results"], strict=True)
    ]


def _one_call(c: httpx.Client, request: dict[str, Any], **where: Any) -> httpx.Response:
    endpoint = where.pop("endpoint", COMPLETIONS)
    return c.post("/v1/cache/lookup", json={"endpoint": endpoint, "request": request, **where})


def agree(c: httpx.Client, request: dict[str, Any], fp: str, endpoint: str = COMPLETIONS) -> Any:
    """The one-call answer to ``request`` under ``fp``, asserted to agree with the two-call
    path: the same key; a hit of the same record, or a miss on both (the same status for an
    index that disagrees with the log)."""
    key = c.post(
        "/v1/cache/key", json={"endpoint": endpoint, "request": request, "fingerprint_id": fp}
    )
    assert key.status_code == 200, key.text
    two = c.get(f"/v1/cache/{key.json()['key']}")
    one = _one_call(c, request, fingerprint_id=fp, endpoint=endpoint)
    if two.status_code >= 500:
        assert one.status_code == two.status_code, one.text
        assert one.json()["error"]["code"] == two.json()["error"]["code"]
        return one.json()
    assert one.status_code == 200, one.text
    data = one.json()
    assert data["key"] == key.json()["key"] and data["fingerprint_id"] == fp
    if two.status_code == 200:
        assert data["hit"] is True, data
        assert (data["request_id"], data["log_index"]) == (
            two.json()["request_id"],
            two.json()["log_index"],
        )
    else:
        assert two.json()["error"]["code"] == "cache_miss"
        assert data["hit"] is False and data["reason"] in {
            "no_record",
            "not_reusable",
            "not_deterministic",
            "fingerprint_changed",
        }, data
    return data


def test_it_agrees_with_the_two_call_path_on_every_case(api: Harness) -> None:
    key, fp = api.setup_collector()
    c = api.client()
    base = record_body(fp, seed=7001, text_prompt=True, request_extra=GREEDY)
    cases = {
        "aborted": record_body(fp, seed=7002, text_prompt=True, request_extra=GREEDY),
        "sampled": record_body(fp, seed=7003, text_prompt=True),
        "tier 0": record_body(fp, seed=7004, text_prompt=True, tier=0, request_extra=GREEDY),
        "seeded": record_body(fp, seed=7005, request_extra={"seed": 9, "temperature": 0.8}),
    }
    cases["aborted"]["aborted"] = True
    twins = [record_body(fp, seed=7006, request_extra=GREEDY) for _ in range(3)]
    made = dict(_post(api, key, base, *cases.values(), *twins))
    request = base["request"]
    # the recorded request, and requests the key treats as the same one
    same = [
        request,
        {**request, "stream": False, "user": "u", "logprobs": None},
        {**request, "top_p": 0.5, "seed": 3},  # greedy: sampler randomness does not count
        {**request, "n": 1, "stop": [], "ignore_eos": False},  # fixed defaults given
        {**request, "presence_penalty": None},  # null is absent to vLLM
    ]
    for r in same:
        assert agree(c, r, fp)["request_id"] == base["request_id"]
    # the same key, but not the same answer from vLLM: not served
    for r in (
        {**request, "model": "other"},  # a served name may be a LoRA adapter
        {**request, "repetition_penalty": 1.0},  # a generation config may set another default
    ):
        data = _one_call(c, r, fingerprint_id=fp).json()
        assert data["hit"] is False and data["reason"] == "not_servable", (r, data)
    # keyed by the token IDs the engine saw
    ids = unpack_int32(base["prompt_token_ids"])
    one = _one_call(c, request, fingerprint_id=fp, prompt_token_ids=ids).json()
    assert one["hit"] and one["request_id"] == base["request_id"]
    other = {**request, "prompt": "another text"}  # its IDs claimed to be the record's
    one = _one_call(c, other, fingerprint_id=fp, prompt_token_ids=ids).json()
    assert one["hit"] is False and one["reason"] == "not_servable", one
    # requests that differ in what matters miss on both paths
    for r in ({**request, "max_tokens": 9}, {**request, "prompt": "another"}):
        assert agree(c, r, fp)["reason"] == "no_record"
    for name in ("aborted", "tier 0"):
        data = agree(c, cases[name]["request"], fp)
        assert data["reason"] == "not_reusable" and name in data["message"]
    assert agree(c, cases["sampled"]["request"], fp)["reason"] == "not_deterministic"
    assert agree(c, cases["seeded"]["request"], fp)["hit"]
    # several reusable records under one key: the earliest in log order, every time
    for _ in range(3):
        assert agree(c, twins[0]["request"], fp)["request_id"] == twins[0]["request_id"]
    assert made[twins[0]["request_id"]] < made[twins[1]["request_id"]]


def test_a_hit_is_vllms_answer_rebuilt_from_the_record(api: Harness) -> None:
    key, fp = api.setup_collector()
    c = api.client()
    body = record_body(fp, seed=7020, text_prompt=True, top_k=5, request_extra=GREEDY)
    body["choices"][0]["text"] = "the recorded text"
    [(rid, idx)] = _post(api, key, body)
    request = body["request"]
    data = _one_call(c, request, fingerprint_id=fp).json()
    assert data["hit"] and (data["request_id"], data["log_index"]) == (rid, idx)
    answer = data["response"]
    assert answer["id"] == f"cmpl-{rid}" and answer["object"] == "text_completion"
    assert answer["model"] == body["model"] and answer["usage"] == body["usage"]
    assert answer["system_fingerprint"] == body["system_fingerprint"]
    (choice,) = answer["choices"]
    assert choice["text"] == "the recorded text" and choice["finish_reason"] == "length"
    assert choice["token_ids"] is None and choice["logprobs"] is None  # not asked for
    out_ids = unpack_int32(body["choices"][0]["token_ids"])
    asked = {**request, "return_token_ids": True}
    (choice,) = _one_call(c, asked, fingerprint_id=fp).json()["response"]["choices"]
    assert choice["token_ids"] == out_ids
    assert choice["prompt_token_ids"] == unpack_int32(body["prompt_token_ids"])
    # logprobs, tokens named by ID (as vLLM names them with return_tokens_as_token_ids)
    asked = {**request, "logprobs": 2, "return_tokens_as_token_ids": True}
    (choice,) = _one_call(c, asked, fingerprint_id=fp).json()["response"]["choices"]
    lps = unpack_float32(body["choices"][0]["logprobs"])
    top = body["choices"][0]["top_logprobs"]
    top_ids, top_lps = unpack_int32(top["token_ids"]), unpack_float32(top["logprobs"])
    names = [f"token_id:{t}" for t in out_ids]
    assert choice["logprobs"]["tokens"] == names
    assert choice["logprobs"]["token_logprobs"] == lps  # float32 values, exactly
    assert choice["logprobs"]["text_offset"][1] == len(names[0])
    for i, row in enumerate(choice["logprobs"]["top_logprobs"]):
        expected = {
            f"token_id:{t}": v
            for t, v in zip(top_ids[i * 5 : i * 5 + 2], top_lps[i * 5 : i * 5 + 2], strict=True)
        }
        expected.setdefault(names[i], lps[i])
        assert row == expected
    # what the record cannot rebuild is a miss that says so, never another answer
    for unservable in (
        {**request, "logprobs": 1},  # token strings need the tokenizer
        {**request, "logprobs": 6, "return_tokens_as_token_ids": True},  # deeper than recorded
    ):
        miss = _one_call(c, unservable, fingerprint_id=fp).json()
        assert miss["hit"] is False and miss["reason"] == "not_servable", unservable


def test_a_streamed_request_gets_its_hit_as_server_sent_events(api: Harness) -> None:
    key, fp = api.setup_collector()
    c = api.client()
    body = record_body(fp, seed=7021, text_prompt=True, request_extra=GREEDY)
    body["choices"][0]["text"] = "streamed text"
    [(rid, idx)] = _post(api, key, body)
    asked = {**body["request"], "stream": True, "stream_options": {"include_usage": True}}
    resp = _one_call(c, asked, fingerprint_id=fp)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["ledger-cache"] == "hit" and resp.headers["ledger-request-id"] == rid
    assert resp.headers["ledger-log-index"] == str(idx)
    assert resp.headers["ledger-fingerprint-id"] == fp
    events = resp.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(ch["id"] == f"cmpl-{rid}" for ch in chunks)
    assert "".join(ch["choices"][0]["text"] for ch in chunks if ch["choices"]) == "streamed text"
    assert [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]][-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == body["usage"]
    # a streamed miss is JSON, like any miss
    miss = _one_call(c, {**asked, "max_tokens": 99}, fingerprint_id=fp)
    assert miss.headers["content-type"] == "application/json" and miss.json()["hit"] is False


def _fingerprint(api: Harness, key: SigningKey, model: str, engine: str = "vllm") -> str:
    """A registered fingerprint of ``model`` (its model section) in ``engine``."""
    body = {"schema_version": 1, "model": {"name": model}, "engine": {"name": engine}}
    resp = api.client().post(
        "/v1/fingerprints", content=sign_envelope(FINGERPRINT_KIND, body, key).canonical
    )
    assert resp.status_code == 201, resp.text
    fp: str = resp.json()["fingerprint_id"]
    return fp


def test_chat_hits_misses_and_a_changed_fingerprint(api: Harness) -> None:
    key = api.collector()
    model = f"m-{uuid.uuid4().hex[:8]}"
    fp, newer = _fingerprint(api, key, model), _fingerprint(api, key, model, "vllm --flag")
    another_model = _fingerprint(api, key, f"m-{uuid.uuid4().hex[:8]}")
    c = api.client()
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    body = build_record_body(
        request_id=f"req-chat-{uuid.uuid4().hex[:8]}",
        fingerprint_id=fp,
        worker_id="w1",
        pool="p1",
        tier=1,
        endpoint=CHAT,
        model="m",
        request=request,
        prompt_token_ids=[1, 2, 3],
        choices=[Choice([4, 5], [-0.5, -0.25], None, None, finish_reason="stop", text="hello")],
        started_at="2026-11-29T09:00:00.123456Z",
        ttft_ns=1,
        total_ns=2,
        system_fingerprint=None,
    )
    [(rid, _)] = _post(api, key, body)
    data = agree(c, request, fp, CHAT)
    assert data["request_id"] == rid
    answer = data["response"]
    assert answer["id"] == f"chatcmpl-{rid}" and answer["object"] == "chat.completion"
    assert answer["created"] == int(datetime(2026, 11, 29, 9, tzinfo=UTC).timestamp())
    (choice,) = answer["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == "hello"
    assert choice["finish_reason"] == "stop"
    streamed = _one_call(c, {**request, "stream": True}, fingerprint_id=fp, endpoint=CHAT)
    chunks = [json.loads(e[6:]) for e in streamed.text.split("\n\n")[:-2]]
    deltas = [ch["choices"][0]["delta"] for ch in chunks]
    assert deltas[0]["role"] == "assistant"
    assert "".join(d.get("content", "") for d in deltas) == "hello"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # chat logprobs name each token's bytes: not rebuilt, a miss that says so
    logprobs = _one_call(c, {**request, "logprobs": True}, fingerprint_id=fp, endpoint=CHAT)
    assert logprobs.json()["reason"] == "not_servable"
    # the same request under a newer fingerprint: a miss that names the one it was answered under
    changed = agree(c, request, newer, CHAT)
    assert changed["reason"] == "fingerprint_changed" and fp in changed["message"]
    # another model's fingerprint: simply no record
    assert agree(c, request, another_model, CHAT)["reason"] == "no_record"


def test_a_pool_resolves_to_its_live_workers_fingerprint(api: Harness) -> None:
    key = api.collector()
    fp, other = (_fingerprint(api, key, f"m-{uuid.uuid4().hex[:8]}") for _ in range(2))
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    for i, served in enumerate((fp, fp, other)):
        worker = {
            "worker_id": f"w-{uuid.uuid4().hex[:8]}",
            "pool": pool,
            "url": "http://127.0.0.1:9",
        }
        assert (
            post_heartbeat(api, heartbeat(key, **worker, fingerprint_id=served)).status_code == 200
        ), i
    body = record_body(fp, seed=7030, text_prompt=True, request_extra=GREEDY, pool=pool)
    [(rid, _)] = _post(api, key, body)
    reader = api.client(api.token("cache:read"))
    data = _one_call(reader, body["request"], pool=pool).json()
    assert data["hit"] and data["request_id"] == rid and data["fingerprint_id"] == fp
    assert data["pool"] == pool and data["pool_fingerprint_ids"] == sorted([fp, other])
    assert_error(_one_call(reader, body["request"], pool="no-such-pool"), 404, "pool_not_found")


def test_a_lookup_by_pool_answers_only_with_that_pools_records(api: Harness) -> None:
    """Another pool's compromised collector, its key scoped to its own pool, signs a record
    that claims this pool's fingerprint, before this pool answers the same request: a lookup
    by fingerprint may serve it (it trusts every collector), a lookup by pool never does."""
    pool, theirs = (f"pool-{uuid.uuid4().hex[:8]}" for _ in range(2))
    honest, rogue = api.collector(pools=[pool]), api.collector(pools=[theirs])
    fp = _fingerprint(api, honest, f"m-{uuid.uuid4().hex[:8]}")
    beat = heartbeat(
        honest,
        worker_id=f"w-{uuid.uuid4().hex[:8]}",
        pool=pool,
        url="http://127.0.0.1:9",
        fingerprint_id=fp,
    )
    assert post_heartbeat(api, beat).status_code == 200
    forged = record_body(fp, seed=7031, text_prompt=True, request_extra=GREEDY, pool=theirs)
    [(forged_id, _)] = _post(api, rogue, forged)
    reader = api.client(api.token("cache:read"))
    for _ in range(3):  # the full check, then the kept answer: the same outcome
        miss = _one_call(reader, forged["request"], pool=pool).json()
        assert not miss["hit"] and miss["reason"] == "no_record", miss
        assert f"no record of pool {pool!r}" in miss["message"]
        by_fp = _one_call(reader, forged["request"], fingerprint_id=fp).json()
        assert by_fp["hit"] and by_fp["request_id"] == forged_id
    own = dict(record_body(fp, seed=7031, text_prompt=True, request_extra=GREEDY, pool=pool))
    [(own_id, _)] = _post(api, honest, own)
    for _ in range(3):
        hit = _one_call(reader, forged["request"], pool=pool).json()
        assert hit["hit"] and hit["request_id"] == own_id, hit
        by_fp = _one_call(reader, forged["request"], fingerprint_id=fp).json()
        assert by_fp["hit"] and by_fp["request_id"] == forged_id  # the earliest, any pool
    # both logged before the first lookup (on Postgres, the one-statement first lookup)
    forged = record_body(fp, seed=7032, text_prompt=True, request_extra=GREEDY, pool=theirs)
    [(forged_id, _)] = _post(api, rogue, forged)
    [(own_id, _)] = _post(
        api, honest, {**forged, "pool": pool, "request_id": f"r-{uuid.uuid4().hex}"}
    )
    for _ in range(3):
        hit = _one_call(reader, forged["request"], pool=pool).json()
        assert hit["hit"] and hit["request_id"] == own_id, hit


def test_a_lookup_by_pool_reads_no_record_of_another_pool(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records of other pools under the key (an attacker's, or a twin pool's) cost a lookup
    by pool nothing: only the pool's own rows are read and checked against their entries."""
    pool, theirs = (f"pool-{uuid.uuid4().hex[:8]}" for _ in range(2))
    key = api.collector()
    fp = _fingerprint(api, key, f"m-{uuid.uuid4().hex[:8]}")
    first = record_body(fp, seed=7040, text_prompt=True, request_extra=GREEDY, pool=theirs)
    others = [{**first, "request_id": f"r-{uuid.uuid4().hex}"} for _ in range(40)]
    _post(api, key, first, *others)
    [(own_id, _)] = _post(api, key, {**first, "pool": pool, "request_id": f"r-{uuid.uuid4().hex}"})
    cache_key = (
        api.client()
        .post(
            "/v1/cache/key",
            json={"endpoint": COMPLETIONS, "request": first["request"], "fingerprint_id": fp},
        )
        .json()["key"]
    )
    checked: list[str] = []
    original = cache.checked_candidate

    def counting(key: str, row: Any, stored: Any, template: Any) -> Any:
        checked.append(row.request_id)
        return original(key, row, stored, template)

    monkeypatch.setattr(cache, "checked_candidate", counting)
    with api.db.read() as s:
        found = cache.find_reusable(s, cache_key, pool)
    assert found.hit is not None and found.hit.request_id == own_id
    assert checked == [own_id] and found.rows == 1
    with api.db.read() as s:
        assert cache.find_reusable(s, cache_key).hit.request_id == first["request_id"]


def test_bad_lookups_are_refused_with_a_clear_error(api: Harness) -> None:
    _, fp = api.setup_collector()
    c = api.client()
    request = {"prompt": "x", "temperature": 0}
    assert_error(_one_call(c, request), 422, "invalid_parameters")  # neither pool nor fingerprint
    assert_error(_one_call(c, request, pool="p", fingerprint_id=fp), 422, "invalid_parameters")
    unknown = "sha256:" + "0" * 64
    assert_error(_one_call(c, request, fingerprint_id=unknown), 404, "fingerprint_not_found")
    assert_error(_one_call(c, request, fingerprint_id="nope"), 422, "invalid_parameters")
    assert_error(
        _one_call(c, request, fingerprint_id=fp, endpoint="/v1/embeddings"), 422, "invalid_request"
    )
    assert_error(
        _one_call(c, {"temperature": 0}, fingerprint_id=fp, endpoint=CHAT), 422, "invalid_request"
    )
    assert_error(c.post("/v1/cache/lookup", content=b"[1]"), 422, "schema_violation")
    assert_error(
        c.post("/v1/cache/lookup", json={"endpoint": COMPLETIONS}), 422, "schema_violation"
    )
    # scopes: cache:read (or records:read) only
    assert_error(
        _one_call(api.client(api.token("records:write")), request, fingerprint_id=fp),
        403,
        "insufficient_scope",
    )
    assert_error(_one_call(api.client(None), request, fingerprint_id=fp), 401, "missing_token")
    assert (
        _one_call(api.client(api.token("records:read")), request, fingerprint_id=fp).json()["hit"]
        is False
    )


def test_prompt_token_ids_never_stand_in_for_a_token_id_prompt(api: Harness) -> None:
    """vLLM runs a prompt of token IDs as those IDs: other ``prompt_token_ids`` beside it are
    refused (the key would be another prompt's), on both paths; the same IDs are a hit."""
    key = api.collector()
    fp = _fingerprint(api, key, f"m-{uuid.uuid4().hex[:8]}")
    c = api.client()
    request = {"model": "m", "prompt": [11, 12, 13], "max_tokens": 2, **GREEDY}
    body = build_record_body(
        request_id=f"req-ids-{uuid.uuid4().hex[:8]}",
        fingerprint_id=fp,
        worker_id="w1",
        pool="p1",
        tier=1,
        endpoint=COMPLETIONS,
        model="m",
        request=request,
        prompt_token_ids=[11, 12, 13],
        choices=[Choice([4, 5], [-0.5, -0.25], None, None, finish_reason="length", text="ab")],
        started_at="2026-11-29T09:00:00.123456Z",
        ttft_ns=1,
        total_ns=2,
        system_fingerprint=None,
    )
    [(rid, _)] = _post(api, key, body)
    other = {**request, "prompt": [99, 98, 97]}
    for _ in range(2):  # the first lookup and a kept answer's
        refused = _one_call(c, other, fingerprint_id=fp, prompt_token_ids=[11, 12, 13])
        assert_error(refused, 422, "invalid_request")
        assert "prompt_token_ids" in refused.json()["error"]["message"]
        hit = _one_call(c, request, fingerprint_id=fp, prompt_token_ids=[11, 12, 13]).json()
        assert hit["hit"] is True and hit["request_id"] == rid
    made = c.post(
        "/v1/cache/key",
        json={
            "endpoint": COMPLETIONS,
            "request": other,
            "fingerprint_id": fp,
            "prompt_token_ids": [11, 12, 13],
        },
    )
    assert_error(made, 422, "invalid_request")


@pytest.fixture(scope="module", params=BACKENDS)
def tampered(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    """A ledger of its own per backend: its index rows are edited as a superuser would, which
    the session's shared ledger must never see (its audit would report them)."""
    backend = request.param
    harness = start_harness(
        backend, fresh_url(request, backend), tmp_path_factory.mktemp(f"cache-{backend}")
    )
    yield harness
    harness.close()


def test_a_kept_answer_is_never_served_once_its_index_rows_change(tampered: Harness) -> None:
    api = tampered
    key, fp = api.setup_collector()
    c = api.client()
    a, b = (record_body(fp, seed=s, text_prompt=True, request_extra=GREEDY) for s in (7040, 7041))
    (ra, ia), (rb, ib) = _post(api, key, a, b)
    for _ in range(2):  # the second answer is the kept one
        assert _one_call(c, a["request"], fingerprint_id=fp).json()["request_id"] == ra
    key_a = c.post(
        "/v1/cache/key",
        json={"endpoint": COMPLETIONS, "request": a["request"], "fingerprint_id": fp},
    ).json()["key"]
    # a row put before it that points at another record: an error, never the kept answer
    superuser(
        api,
        ("cache_keys",),
        (
            "INSERT INTO cache_keys (cache_key, request_id, log_index, tier, deterministic) "
            "VALUES (:k, :r, :i, 1, true)",
            {"k": key_a, "r": rb, "i": ia - 1},
        ),
    )
    assert_error(_one_call(c, a["request"], fingerprint_id=fp), 500, "index_mismatch")
    superuser(
        api,
        ("cache_keys",),
        ("DELETE FROM cache_keys WHERE cache_key = :k AND request_id = :r", {"k": key_a, "r": rb}),
    )
    assert _one_call(c, a["request"], fingerprint_id=fp).json()["request_id"] == ra
    # the row deleted: the record is hidden, nothing more
    superuser(api, ("cache_keys",), ("DELETE FROM cache_keys WHERE cache_key = :k", {"k": key_a}))
    assert _one_call(c, a["request"], fingerprint_id=fp).json()["reason"] == "no_record"
    assert ib > ia


def test_erased_content_is_never_served(api: Harness) -> None:
    key, fp = api.setup_collector()
    c = api.client()
    env, disclosures = record_v2(key, fp, tier=1, seed=7050, text_prompt=True, request_extra=GREEDY)
    resp = c.post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert resp.status_code == 201, resp.text
    rid = env.body["request_id"]
    request = record_body(fp, seed=7050, text_prompt=True, request_extra=GREEDY)["request"]
    for _ in range(2):  # kept in the process after the second
        assert _one_call(c, request, fingerprint_id=fp).json()["request_id"] == rid
    erased = c.post(f"/v1/records/{rid}/erasure", json={"reason": "Art. 17"})
    assert erased.status_code == 201, erased.text
    data = _one_call(c, request, fingerprint_id=fp).json()
    # an erasure deletes the key with the content: nothing tells the prompt was ever sent
    assert data["hit"] is False and data["reason"] == "no_record" and "response" not in data


def _kept_ids(hot: HotAnswers) -> set[str]:
    return {k.found.hit.request_id for k, _ in hot._items.values() if k.found.hit is not None}


def _kept_figures(api: Harness) -> tuple[float, float, float]:
    """``ledger_cache_kept_bytes``, ``_answers`` and ``_bytes_limit`` as /metrics says now."""
    text_ = api.client(None).get("/metrics").text
    values = dict(
        line.rsplit(" ", 1) for line in text_.splitlines() if line.startswith("ledger_cache_kept")
    )
    prefix = "ledger_cache_kept"
    return (
        float(values[f"{prefix}_bytes"]),
        float(values[f"{prefix}_answers"]),
        float(values[f"{prefix}_bytes_limit"]),
    )


def test_metrics_say_how_full_the_kept_answers_are(api: Harness) -> None:
    """/metrics gives what the kept answers are charged, how many there are and the limit, as
    they stand: after a lookup keeps one, and after an erasure forgets it."""
    key, fp = api.setup_collector()
    c = api.client()
    hot: HotAnswers = api.server.server.config.app.state.ledger.hot_answers
    limit = api.server.server.config.app.state.ledger.settings.cache_memory_bytes
    env, disclosures = record_v2(key, fp, tier=1, seed=7070, text_prompt=True, request_extra=GREEDY)
    posted = c.post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert posted.status_code == 201, posted.text
    rid = env.body["request_id"]
    body = record_body(fp, seed=7070, text_prompt=True, request_extra=GREEDY)
    before = len(hot)
    assert _one_call(c, body["request"], fingerprint_id=fp).json()["request_id"] == rid
    assert rid in _kept_ids(hot) and len(hot) == before + 1
    assert _kept_figures(api) == (hot.bytes, len(hot), limit) and hot.bytes > 0
    assert c.post(f"/v1/records/{rid}/erasure", json={"reason": "r"}).status_code == 201
    assert rid not in _kept_ids(hot)
    assert _kept_figures(api) == (hot.bytes, len(hot), limit)


def test_an_erasure_leaves_no_kept_answer_holding_the_content(api: Harness) -> None:
    """A kept answer holds the record it serves, content and all: the process that erases a
    record forgets it at once, and any process drops it the next time the key is looked up
    (its rows changed), so erased content does not stay in memory until pushed out."""
    key, fp = api.setup_collector()
    c = api.client()
    hot: HotAnswers = api.server.server.config.app.state.ledger.hot_answers
    rids, requests = [], []
    for seed in (7060, 7061):
        env, disclosures = record_v2(
            key, fp, tier=1, seed=seed, text_prompt=True, request_extra=GREEDY
        )
        posted = c.post(
            "/v1/records",
            json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]},
        )
        assert posted.status_code == 201, posted.text
        rids.append(env.body["request_id"])
        requests.append(
            record_body(fp, seed=seed, text_prompt=True, request_extra=GREEDY)["request"]
        )
        for _ in range(2):
            assert _one_call(c, requests[-1], fingerprint_id=fp).json()["request_id"] == rids[-1]
    assert set(rids) <= _kept_ids(hot)
    # the route that erases forgets the record's answers in its process
    assert c.post(f"/v1/records/{rids[0]}/erasure", json={"reason": "r"}).status_code == 201
    assert rids[0] not in _kept_ids(hot) and rids[1] in _kept_ids(hot)
    # another process's answers (here, a lookup's own): dropped once the key's rows changed
    other = HotAnswers()
    assert answer(api.db, COMPLETIONS, requests[1], fp, hot=other).hit
    assert rids[1] in _kept_ids(other)
    assert erasures.erase(api.db, api.log_key, rids[1], reason="r", requested_by="t").status
    assert answer(api.db, COMPLETIONS, requests[1], fp, hot=other).hit is False
    assert not _kept_ids(other)


def test_an_answer_verified_before_an_erasure_is_not_kept_after_its_forget(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup that verified an answer just before an erasure committed, and keeps it just
    after the erasing route forgot the record's answers, would hold the erased content in
    memory: it is not kept."""
    key, fp = api.setup_collector()
    env, disclosures = record_v2(key, fp, tier=1, seed=7062, text_prompt=True, request_extra=GREEDY)
    posted = api.client().post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert posted.status_code == 201, posted.text
    rid = env.body["request_id"]
    request = record_body(fp, seed=7062, text_prompt=True, request_extra=GREEDY)["request"]
    hot = HotAnswers()
    real = cache_lookup.read_rows
    calls = []

    def rows_then_erase(db: Any, k: str) -> Any:
        rows = real(db, k)
        calls.append(k)
        if len(calls) == 2:  # the re-read before keeping: the erasure lands right after it
            hot.after_erasure(
                lambda: erasures.erase(api.db, api.log_key, rid, reason="r", requested_by="t"),
                lambda _: {rid},
            )
        return rows

    monkeypatch.setattr(cache_lookup, "read_rows", rows_then_erase)
    assert answer(api.db, COMPLETIONS, request, fp, hot=hot).hit  # verified before the erasure
    assert len(calls) == 2 and not _kept_ids(hot)


@pytest.mark.parametrize("stream", [False, True])
def test_a_non_deterministic_request_is_never_looked_up(api: Harness, stream: bool) -> None:
    key, fp = api.setup_collector()
    body = record_body(fp, seed=7060, text_prompt=True, request_extra={"temperature": 0.7})
    _post(api, key, body)
    data = _one_call(api.client(), {**body["request"], "stream": stream}, fingerprint_id=fp).json()
    assert data["hit"] is False and data["reason"] == "not_deterministic"


def test_a_kept_answer_is_the_routes_answer_and_refusals_stay_refusals(api: Harness) -> None:
    """The second lookup of a key is answered from the process (api/cache_fast.py): the same
    bytes as the first, for JSON and for SSE; the gate's checks and the body's strictness
    still apply to it."""
    key, fp = api.setup_collector()
    c = api.client()
    body = record_body(fp, seed=7070, text_prompt=True, request_extra=GREEDY)
    _post(api, key, body)
    for request in (body["request"], {**body["request"], "stream": True}):
        first, second = (_one_call(c, request, fingerprint_id=fp) for _ in range(2))
        assert first.status_code == second.status_code == 200
        assert first.content == second.content
        assert first.headers["content-type"] == second.headers["content-type"]
    lookup = {"endpoint": COMPLETIONS, "request": body["request"], "fingerprint_id": fp}
    raw = json.dumps(lookup).encode()
    twice = raw[:-1] + b', "fingerprint_id": "' + fp.encode() + b'"}'  # a duplicate member
    assert_error(
        c.post("/v1/cache/lookup", content=twice, headers={"content-type": "application/json"}),
        400,
        "invalid_json",
    )
    assert_error(
        c.post("/v1/cache/lookup", content=raw, headers={"content-type": "text/plain"}),
        400,
        "invalid_json",
    )
    writer = api.client(api.token("records:write"))
    assert_error(writer.post("/v1/cache/lookup", json=lookup), 403, "insufficient_scope")
    extra = {**lookup, "unknown": 1}
    assert_error(c.post("/v1/cache/lookup", json=extra), 422, "schema_violation")
    # a miss answered from the process is the route's miss too
    other = {**body["request"], "max_tokens": 77}
    misses = [_one_call(c, other, fingerprint_id=fp) for _ in range(3)]
    assert {m.content for m in misses} == {misses[0].content}
    assert misses[0].json()["reason"] == "no_record"


def test_a_lookup_of_a_long_prompt_is_answered_by_the_route(api: Harness) -> None:
    """The process's own path parses and keys a body on the event loop: a body past 64 KiB
    (a long prompt) goes to the route, which does both on a worker thread, and gets the same
    answer every time."""
    key, fp = api.setup_collector()
    c = api.client()
    body = record_body(fp, seed=7075, prompt_len=12_000, text_prompt=True, request_extra=GREEDY)
    _post(api, key, body)
    lookup = {"endpoint": COMPLETIONS, "request": body["request"], "fingerprint_id": fp}
    assert len(json.dumps(lookup)) > LOOP_BODY
    before = {via: _lookups_counted(api, "hit", via) for via in ("first", "kept", "log")}
    answers = [c.post("/v1/cache/lookup", json=lookup) for _ in range(3)]
    assert all(a.status_code == 200 and a.json()["hit"] for a in answers), answers[0].text
    assert {a.content for a in answers} == {answers[0].content}
    after = {via: _lookups_counted(api, "hit", via) for via in before}
    assert after == {**before, "log": before["log"] + 3}


def _lookups_counted(api: Harness, outcome: str, via: str) -> float:
    """``ledger_cache_lookups{outcome, via}`` as /metrics says now (0 when absent)."""
    text_ = api.client(None).get("/metrics").text
    prefix = f'ledger_cache_lookups_total{{outcome="{outcome}",via="{via}"}} '
    return sum(float(line[len(prefix) :]) for line in text_.splitlines() if line.startswith(prefix))


def test_a_keys_first_lookup_is_the_answer_the_full_check_gives(api: Harness) -> None:
    """A key looked up for the first time is answered from one read of its rows with their log
    entries (Postgres; SQLite goes through the full check): the bytes are those the full
    check against the log renders, for JSON and SSE, completions and chat, v1 and v2 records,
    and of several reusable records the earliest."""
    key, fp = api.setup_collector()
    c = api.client()
    prime = record_body(fp, seed=7080, text_prompt=True, request_extra=GREEDY)
    v1 = record_body(fp, seed=7081, text_prompt=True, top_k=3, request_extra=GREEDY)
    twins = [record_body(fp, seed=7082, request_extra=GREEDY) for _ in range(2)]
    _post(api, key, prime, v1, *twins)
    env, disclosures = record_v2(key, fp, seed=7083, text_prompt=True, request_extra=GREEDY)
    resp = c.post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert resp.status_code == 201, resp.text
    v2 = record_body(fp, seed=7083, text_prompt=True, request_extra=GREEDY)
    assert _one_call(c, prime["request"], fingerprint_id=fp).json()["hit"]  # the facts read
    requests = [
        v1["request"],
        {**v1["request"], "logprobs": 2, "return_tokens_as_token_ids": True},
        {**v1["request"], "stream": True, "return_token_ids": True},
        v2["request"],
        twins[0]["request"],
    ]
    first = _lookups_counted(api, "hit", "first")
    for request in requests:
        payload = CacheLookupRequest(endpoint=COMPLETIONS, request=request, fingerprint_id=fp)
        found = answer(api.db, COMPLETIONS, request, fp, hot=HotAnswers())
        expected = render_answer(found, {"pool": None}, payload)
        got = _one_call(c, request, fingerprint_id=fp)
        assert got.status_code == 200 and got.content == bytes(expected.body), request
        assert got.headers["content-type"] == expected.headers["content-type"]
    assert (
        _one_call(c, twins[1]["request"], fingerprint_id=fp).json()["request_id"]
        == (twins[0]["request_id"])
    )
    answered_first = _lookups_counted(api, "hit", "first") - first
    # the same request keyed again (logprobs and streaming are not in the key): kept by then
    assert answered_first == (3 if api.db.is_postgres else 0)


def test_a_first_lookup_serves_nothing_the_log_does_not_say(tampered: Harness) -> None:
    """Index rows edited as a database superuser would, each under a key never looked up before
    (so no kept answer is involved): every one is 500 ``index_mismatch``, never a hit."""
    api = tampered
    key, fp = api.setup_collector()
    c = api.client()
    victim = record_body(fp, seed=7090, text_prompt=True, request_extra=GREEDY)
    tier0 = record_body(fp, seed=7091, text_prompt=True, tier=0, request_extra=GREEDY)
    (rv, iv), (r0, _) = _post(api, key, victim, tier0)
    v2s = []
    for seed in (7092, 7093):
        env, disclosures = record_v2(key, fp, seed=seed, text_prompt=True, request_extra=GREEDY)
        resp = c.post(
            "/v1/records",
            json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]},
        )
        assert resp.status_code == 201, resp.text
        v2s.append((env.body["request_id"], resp.json()["results"][0]["log_index"], seed))
    assert _one_call(c, victim["request"], fingerprint_id=fp).json()["request_id"] == rv

    def key_of(request: dict[str, Any]) -> str:
        body = {"endpoint": COMPLETIONS, "request": request, "fingerprint_id": fp}
        made: str = c.post("/v1/cache/key", json=body).json()["key"]
        return made

    forged = {**victim["request"], "prompt": "a prompt never answered"}
    (deleted, _, deleted_seed), (kept, kept_at, kept_seed) = v2s
    superuser(
        api,
        ("cache_keys", "disclosures", "erasures"),
        # a key that no record has, pointed at the victim's record (its own request ID)
        (
            "INSERT INTO cache_keys (cache_key, request_id, log_index, tier, deterministic) "
            "VALUES (:k, :r, :i, 1, true)",
            {"k": key_of(forged), "r": rv, "i": iv},
        ),
        # a tier 0 record's row marked reusable
        ("UPDATE cache_keys SET tier = 1 WHERE request_id = :r", {"r": r0}),
        # a v2 record's content deleted without an erasure
        ("DELETE FROM disclosures WHERE request_id = :r", {"r": deleted}),
        # an erasure row for a record whose content is still stored
        (
            "INSERT INTO erasures (request_id, log_index, reason_code, created_at) "
            "VALUES (:r, :i, 'request', :t)",
            {"r": kept, "i": kept_at, "t": datetime.now(UTC)},
        ),
    )
    attacked = [
        forged,
        tier0["request"],
        *(
            record_body(fp, seed=s, text_prompt=True, request_extra=GREEDY)["request"]
            for s in (deleted_seed, kept_seed)
        ),
    ]
    hits = {via: _lookups_counted(api, "hit", via) for via in ("first", "kept", "log")}
    for request in attacked:
        for stream in (False, True):
            got = _one_call(c, {**request, "stream": stream}, fingerprint_id=fp)
            assert_error(got, 500, "index_mismatch")
    assert {via: _lookups_counted(api, "hit", via) for via in hits} == hits
    assert hits["log"] >= 1  # the counter counts (the victim's lookup)


def test_a_chat_record_checked_before_its_fingerprint_was_registered_is_keyed_with_its_template(
    api: Harness,
) -> None:
    """``POST /v1/records`` keys a batch before it takes the append lock; a chat record whose
    fingerprint is registered by a concurrent ``POST /v1/fingerprints`` in between was keyed
    without the fingerprint's chat template, under keys no lookup makes (and the audit named
    them). The batch is keyed again under the lock: here the interleaving, step by step."""
    from ledger.fingerprint import validate_fingerprint_body
    from ledger.record_v2 import commit_record
    from ledger.storage import ingest
    from ledger.storage.audit import audit
    from tests.support.audited_ledger import chat_body

    key = api.collector()
    fingerprint = _chat_fingerprint(key, {"digest": "sha256:" + "ab" * 32}, {"name": "test"})
    fp = validate_fingerprint_body(fingerprint.body)
    body, disclosures = commit_record(chat_body(fp, f"chat-{uuid.uuid4().hex[:10]}"))
    envelope = sign_envelope(RECORD_KIND, body, key)
    checked = ingest.check_batch(api.db, [ingest.RecordItem(envelope.to_dict(), disclosures)])
    ingest.add_fingerprint(api.db, fingerprint.to_dict())  # the concurrent registration
    (outcome,) = ingest.write_batches(api.db, [checked])
    assert not isinstance(outcome, Exception), outcome
    assert api.client().post("/v1/log/checkpoint").status_code == 200
    report = audit(api.db, api.log_key.public_key)
    assert report.ok, [f.message for f in report.findings]
    request = chat_body(fp, body["request_id"])["request"]
    found = _one_call(api.client(), request, fingerprint_id=fp, endpoint=CHAT).json()
    assert found["hit"] is True and found["request_id"] == body["request_id"], found


def test_requests_vllm_would_answer_otherwise_are_not_served(api: Harness) -> None:
    """Requests whose key matches a record's but which vLLM would answer differently, or
    refuse, are misses (``not_servable``), never another request's answer."""
    key, fp = api.setup_collector()
    c = api.client()
    stops = record_body(
        fp, seed=7090, text_prompt=True, request_extra={**GREEDY, "stop": ["b", "ab"]}
    )
    random = record_body(
        fp, seed=7091, text_prompt=True, request_extra={"temperature": 0.7, "seed": -1}
    )
    plain = record_body(fp, seed=7092, text_prompt=True, top_k=3, request_extra=GREEDY)
    _post(api, key, stops, random, plain)

    def miss(request: dict[str, Any], says: str) -> None:
        data = _one_call(c, request, fingerprint_id=fp).json()
        assert data["hit"] is False and data["reason"] == "not_servable", (request, data)
        assert says in data["message"], data["message"]

    assert _one_call(c, stops["request"], fingerprint_id=fp).json()["hit"]
    miss({**stops["request"], "stop": ["ab", "b"]}, "another order")  # vLLM: first listed wins
    # seed -1 is none to vLLM, in any form it reads as -1: it samples at random, so the
    # request is not deterministic, and the record of one (a collector may sign it at tier 1)
    # is no answer on either path, though the index counts its seed
    for seed in (-1, -1.0, "-1"):
        asked = _one_call(c, {**random["request"], "seed": seed}, fingerprint_id=fp).json()
        assert asked["hit"] is False and asked["reason"] == "not_deterministic", asked
    random_key = c.post(
        "/v1/cache/key",
        json={"endpoint": COMPLETIONS, "request": random["request"], "fingerprint_id": fp},
    ).json()["key"]
    served = c.get(f"/v1/cache/{random_key}")
    assert served.status_code == 404 and served.json()["error"]["code"] == "cache_miss"
    assert "non-deterministic sampling" in served.json()["error"]["message"]
    request = plain["request"]
    assert _one_call(c, request, fingerprint_id=fp).json()["hit"]
    miss({**request, "stream": "true"}, "stream must be true or false")  # vLLM reads it lax
    miss({**request, "return_token_ids": 1}, "return_token_ids must be true or false")
    miss({**request, "n": None}, "n: null")  # vLLM: 400
    miss({**request, "priority": 5}, "priority")
    miss({**request, "priority": None}, "priority")
    miss({**request, "stream_options": {"include_usage": True}}, "stream_options without stream")
    # members the key ignores, of types vLLM's request models refuse (400)
    miss({**request, "user": {"a": [1]}}, "user that is not a string")
    miss({**request, "request_id": [1]}, "request_id that is not a string")
    miss({**request, "request_id": None}, "request_id that is not a string")
    streamed = {**request, "stream": True}
    miss({**streamed, "stream_options": "x"}, "stream_options that are not an object")
    miss({**streamed, "stream_options": {"include_usage": [1]}}, "include_usage must be true")
    assert _one_call(c, {**request, "user": "u", "request_id": "r"}, fingerprint_id=fp).json()[
        "hit"
    ]
    # completions: vLLM fills an absent limit with 16, so 16 given is the same request
    sixteen = record_body(fp, seed=7093, text_prompt=True, request_extra=GREEDY)
    sixteen["request"]["max_tokens"] = 16
    _post(api, key, sixteen)
    absent = {k: v for k, v in sixteen["request"].items() if k != "max_tokens"}
    assert _one_call(c, absent, fingerprint_id=fp).json()["hit"] is True
    asked = {**request, "logprob_token_ids": [1]}  # part of the key: a miss of its own
    assert _one_call(c, asked, fingerprint_id=fp).json()["hit"] is False
    # logprobs 0 still names the sampled token at each position, as vLLM does
    zero = {**request, "logprobs": 0, "return_tokens_as_token_ids": True}
    data = _one_call(c, zero, fingerprint_id=fp).json()
    assert data["hit"] is True, data
    choice = data["response"]["choices"][0]
    logprobs = choice["logprobs"]
    assert logprobs["top_logprobs"] == [
        {name: lp} for name, lp in zip(logprobs["tokens"], logprobs["token_logprobs"], strict=True)
    ]


@pytest.mark.parametrize(
    ("parser", "clock", "says"),
    [("qwen3", False, "reasoning"), ("default", True, "reads the date"), ("default", False, "")],
)
def test_a_chat_record_of_an_engine_that_parses_reasoning_is_not_served(
    api: Harness, parser: str, clock: bool, says: str
) -> None:
    """vLLM with --reasoning-parser returns the reasoning beside the content (the record holds
    the content only), and a template that reads the date renders another prompt another day:
    such chat answers are not rebuilt (otherwise: served)."""
    template: dict[str, Any] = {"digest": "sha256:" + "cd" * 32}
    if clock:
        template["reads_clock"] = True
    from ledger.fingerprint import validate_fingerprint_body
    from ledger.record_v2 import commit_record
    from tests.support.audited_ledger import chat_body

    key = api.collector()
    engine = {"name": "vllm", "reasoning_parser": parser}
    fingerprint = _chat_fingerprint(key, template, engine)
    assert api.client().post("/v1/fingerprints", content=fingerprint.canonical).status_code == 201
    fp = validate_fingerprint_body(fingerprint.body)
    body, disclosures = commit_record(chat_body(fp, f"chat-{uuid.uuid4().hex[:10]}"))
    envelope = sign_envelope(RECORD_KIND, body, key)
    posted = api.client().post(
        "/v1/records",
        json={"records": [{"envelope": envelope.to_dict(), "disclosures": disclosures}]},
    )
    assert posted.status_code == 201, posted.text
    request = chat_body(fp, body["request_id"])["request"]
    for _ in range(2):  # the first lookup, then the kept answer's path
        data = _one_call(api.client(), request, fingerprint_id=fp, endpoint=CHAT).json()
        if not says:
            assert data["hit"] is True, data
            zero = {**request, "top_logprobs": 0}  # vLLM takes 0 without logprobs
            assert _one_call(api.client(), zero, fingerprint_id=fp, endpoint=CHAT).json()["hit"]
        else:
            assert data["hit"] is False and data["reason"] == "not_servable", data
            assert says in data["message"]


def test_a_batch_whose_rekeying_fails_gets_its_error_and_the_others_their_results(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: a batch refused while it is keyed again under the lock (its fingerprint's
    row disagrees with the log, say) gets that error alone; the next batch is appended."""
    from ledger.errors import LedgerError
    from ledger.storage import ingest

    key, fp = api.setup_collector()
    first, second = (
        ingest.check_batch(api.db, [record_envelope_for(key, fp, seed)]) for seed in (7101, 7102)
    )
    real = ingest._rekey_late_templates

    def refuse_first(s: Any, b: Any, known: Any) -> None:
        if b is first:
            raise LedgerError("the fingerprint row disagrees", code="index_mismatch")
        real(s, b, known)

    monkeypatch.setattr(ingest, "_rekey_late_templates", refuse_first)
    refused, done = ingest.write_batches(api.db, [first, second])
    assert isinstance(refused, LedgerError) and refused.code == "index_mismatch"
    assert not isinstance(done, LedgerError)
    assert [r.request_id for r in done] == [second.checked[0].summary.request_id]


def record_envelope_for(key: SigningKey, fp: str, seed: int) -> dict[str, Any]:
    body = record_body(fp, seed=seed, text_prompt=True, request_extra=GREEDY)
    return sign_envelope(RECORD_KIND, body, key).to_dict()


def _chat_fingerprint(key: SigningKey, template: dict[str, Any], engine: dict[str, Any]) -> Any:
    """A signed fingerprint of a chat model of its own, with this template and engine."""
    model = {"name": f"chat-{uuid.uuid4().hex[:8]}", "chat_template": template}
    body = {"schema_version": 1, "model": model, "engine": engine}
    return sign_envelope(FINGERPRINT_KIND, body, key)


def test_the_memory_for_kept_answers_is_the_operators_setting(
    db: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LEDGER_CACHE_MEMORY_BYTES`` bounds what each worker keeps (0: nothing; every lookup
    then checks the log); a negative value is refused at start."""
    monkeypatch.setenv("LEDGER_CACHE_MEMORY_BYTES", "0")
    settings = Settings(data_dir=tmp_path, database_url=db.url)
    app = create_app(settings, db, SigningKey.generate())
    hot: HotAnswers = app.state.ledger.hot_answers
    kept = cache_lookup._Kept((), cache.Found(None, (), 0, frozenset()))
    hot.put("k", kept, hot.generation)
    assert hot.get("k") is None and len(hot) == 0
    monkeypatch.setenv("LEDGER_CACHE_MEMORY_BYTES", "-1")
    with pytest.raises(ValidationError, match="cache_memory_bytes"):
        Settings(data_dir=tmp_path, database_url=db.url)
