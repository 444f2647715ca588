"""Cache keys (ck1): equivalent requests agree; any change that matters gives another key."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.cachekey import (
    CHAT,
    COMPLETIONS,
    PREFIX,
    cache_key,
    is_deterministic,
    normalize_params,
    record_keys,
    samples_at_random,
)
from ledger.canonical import canonicalize
from ledger.errors import InvalidInput

FP = "sha256:" + "a" * 64
FP2 = "sha256:" + "b" * 64
TEMPLATE = "sha256:" + "c" * 64


def key(request: dict[str, Any], fp: str = FP, **kw: Any) -> str:
    return cache_key(COMPLETIONS, request, fp, **kw)


BASE = {"model": "fixture", "prompt": "Hello", "max_tokens": 8, "temperature": 0}


def test_format_is_labelled() -> None:
    k = key(BASE)
    assert k.startswith(PREFIX) and len(k) == len(PREFIX) + 64


def test_fields_that_do_not_change_output_are_ignored() -> None:
    same = {
        **BASE,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "alice",
        "model": "another-name",
        "logprobs": 5,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    assert key(same) == key(BASE)


def test_defaults_are_filled_in() -> None:
    explicit = {
        **BASE,
        "n": 1,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1,
        "stop": [],
        "top_k": 0,
    }
    assert key(explicit) == key(BASE)
    assert key({"prompt": "Hello"}) == key({"prompt": "Hello", "max_tokens": 16, "temperature": 1})


def test_greedy_ignores_sampler_randomness_and_truncation() -> None:
    assert key({**BASE, "seed": 7, "top_p": 0.5, "top_k": 3}) == key(BASE)
    sampled = {**BASE, "temperature": 0.7}
    assert key({**sampled, "seed": 7}) != key({**sampled, "seed": 8})
    assert key({**sampled, "top_p": 0.5}) != key(sampled)


def test_stop_order_and_form_do_not_matter() -> None:
    assert key({**BASE, "stop": "x"}) == key({**BASE, "stop": ["x"]})
    assert key({**BASE, "stop": ["b", "a"]}) == key({**BASE, "stop": ["a", "b", "a"]})
    assert key({**BASE, "stop": ["a"]}) != key(BASE)


def test_text_and_token_id_forms() -> None:
    by_ids = key({**BASE, "prompt": [72, 101]})
    assert key(BASE, prompt_token_ids=[72, 101]) == by_ids
    assert key(BASE) != by_ids  # the text form is its own key (the ledger indexes both)


def test_fingerprint_always_separates() -> None:
    assert key(BASE, FP) != key(BASE, FP2)


def test_chat_uses_messages_and_the_template_digest() -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    k = cache_key(CHAT, chat, FP, chat_template=TEMPLATE)
    assert k == cache_key(CHAT, {**chat, "stream": True}, FP, chat_template=TEMPLATE)
    assert k != cache_key(CHAT, chat, FP, chat_template="sha256:" + "d" * 64)
    assert k != cache_key(COMPLETIONS, {"prompt": "hi", "temperature": 0}, FP)
    assert cache_key(CHAT, {**chat, "max_completion_tokens": 5}, FP) == cache_key(
        CHAT, {**chat, "max_tokens": 5}, FP
    )


def test_a_chat_limit_is_read_as_vllm_reads_it() -> None:
    """max_completion_tokens unless it is null, then max_tokens: a 5-token answer is never the
    answer to a request that allows 100."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}

    def k(**limits: object) -> str:
        return cache_key(CHAT, {**chat, **limits}, FP)

    assert k(max_tokens=5, max_completion_tokens=100) == k(max_tokens=100)
    assert k(max_tokens=5, max_completion_tokens=100) != k(max_tokens=5)
    assert k(max_tokens=None, max_completion_tokens=7) == k(max_tokens=7)
    assert k(max_tokens=None, max_completion_tokens=7) != k()
    assert k(max_tokens=5, max_completion_tokens=None) == k(max_tokens=5)
    assert k(max_completion_tokens=None) == k()


@pytest.mark.parametrize(
    "request_body",
    [
        {"prompt": ["a", 1]},
        {"prompt": None},
        {"prompt": "x", "temperature": "hot"},
        {"prompt": "x", "stop": [1]},
        {"prompt": "x", "stop_token_ids": ["1"]},
    ],
)
def test_bad_requests_are_refused(request_body: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        key(request_body)


def test_token_ids_given_as_integral_floats_are_those_integers() -> None:
    """vLLM reads 7.0 as the ID 7 and a signed record's bytes write it 7, so the audit keys the
    record with 7: a lookup with 7.0 gets that key (it was refused), and 7.5 or true stay
    refused."""
    assert key({**BASE, "stop_token_ids": [7.0, 3]}) == key({**BASE, "stop_token_ids": [3, 7]})
    assert key({**BASE, "prompt": [1.0, 2.0]}) == key({**BASE, "prompt": [1, 2]})
    for bad in ({"stop_token_ids": [7.5]}, {"stop_token_ids": [True]}, {"prompt": [1.0, 0.5]}):
        with pytest.raises(InvalidInput):
            key({**BASE, **bad})


def test_chat_without_messages_is_refused() -> None:
    with pytest.raises(InvalidInput):
        cache_key(CHAT, {"prompt": "x"}, FP)


def test_determinism() -> None:
    assert is_deterministic({"temperature": 0})
    assert is_deterministic({"temperature": 0.8, "seed": 1})
    assert not is_deterministic({"temperature": 0.8})
    assert not is_deterministic({})  # the default temperature is 1


def test_seed_minus_one_samples_at_random_as_vllm_reads_it() -> None:
    """vLLM takes seed -1 (as -1, -1.0 or "-1") for none; the index's flag counts any seed."""
    for seed in (-1, -1.0, "-1", " -1 ", None):
        assert samples_at_random({"temperature": 0.8, "seed": seed}), seed
        assert not samples_at_random({"temperature": 0, "seed": seed}), seed
    assert samples_at_random({"seed": -1})  # the default temperature is 1
    for seed in (0, 7, "7", 2**63 - 1, True, "x", [1]):
        assert not samples_at_random({"temperature": 0.8, "seed": seed}), seed
    assert is_deterministic({"temperature": 0.8, "seed": -1})
    # the temperature as vLLM (and the collector's tier check) reads it: "0" and false are 0
    for greedy in (0, 0.0, "0", " 0.0 ", False):
        assert not samples_at_random({"temperature": greedy}), greedy
    for sampled in (0.7, "0.7", True, "x", "\u0660"):
        assert samples_at_random({"temperature": sampled}), sampled


params = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.sampled_from([0, 0.5, 1.0]),
        "top_p": st.sampled_from([0.5, 1.0]),
        "max_tokens": st.integers(1, 64),
        "seed": st.integers(0, 2**31),
        "presence_penalty": st.sampled_from([0.0, 0.5]),
        "stop": st.lists(st.sampled_from(["a", "b", "\n"]), max_size=3),
    },
)
prompts = st.one_of(st.text(max_size=20), st.lists(st.integers(0, 511), min_size=1, max_size=20))


@given(params, prompts)
def test_property_key_ignores_presentation(p: dict[str, Any], prompt: Any) -> None:
    request = {"prompt": prompt, **p}
    noisy = {**request, "stream": True, "user": "u", "logprobs": 2}
    assert key(request) == key(noisy)
    assert key(dict(reversed(list(request.items())))) == key(request)


@given(params, prompts, st.sampled_from(["max_tokens", "presence_penalty", "prompt"]))
def test_property_changing_what_matters_changes_the_key(
    p: dict[str, Any], prompt: Any, field: str
) -> None:
    request = {"prompt": prompt, **p}
    changed = dict(request)
    if field == "max_tokens":
        changed["max_tokens"] = request.get("max_tokens", 16) + 1
    elif field == "presence_penalty":
        changed["presence_penalty"] = request.get("presence_penalty", 0.0) + 0.25
    else:
        changed["prompt"] = prompt + "!" if isinstance(prompt, str) else [*prompt, 7]
    assert key(changed) != key(request)
    assert key(request, FP) != key(request, FP2)


def reference_key(endpoint: str, request: dict[str, Any], fp: str, prompt: dict[str, Any]) -> str:
    """ck1 as the module docstring defines it: one canonical document, hashed."""
    document = {
        "algorithm": "ck1",
        "fingerprint_id": fp,
        "endpoint": endpoint,
        "prompt": prompt,
        "params": normalize_params(endpoint, request),
    }
    return PREFIX + hashlib.sha256(canonicalize(document)).hexdigest()


@given(
    prompt=st.text(max_size=40),
    ids=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=40),
    temperature=st.sampled_from([0, 0.0, 0.7, 1, 1.5]),
    seed=st.none() | st.integers(0, 2**31 - 1),
    stop=st.lists(st.text(max_size=5), max_size=3),
)
def test_keys_equal_the_reference_document_hash(prompt, ids, temperature, seed, stop) -> None:
    request = {"prompt": prompt, "temperature": temperature, "seed": seed, "stop": stop}
    text_key = reference_key(COMPLETIONS, request, FP, {"text": prompt})
    ids_key = reference_key(COMPLETIONS, request, FP, {"token_ids": ids})
    assert key(request) == text_key
    assert key(request, prompt_token_ids=ids) == ids_key
    assert record_keys(COMPLETIONS, request, FP, prompt_token_ids=ids) == sorted(
        {text_key, ids_key}
    )
    # a prompt given as token IDs is keyed once, by the IDs the engine saw
    by_ids = {**request, "prompt": ids}
    assert record_keys(COMPLETIONS, by_ids, FP, prompt_token_ids=ids) == [ids_key]
    chat = {"messages": [{"role": "user", "content": prompt}], "temperature": temperature}
    chat_key = reference_key(
        CHAT, chat, FP, {"messages": chat["messages"], "chat_template": TEMPLATE}
    )
    assert cache_key(CHAT, chat, FP, chat_template=TEMPLATE) == chat_key
    assert record_keys(CHAT, chat, FP, chat_template=TEMPLATE) == [chat_key]


def test_record_keys_refuse_what_cache_key_refuses() -> None:
    with pytest.raises(InvalidInput):
        record_keys(COMPLETIONS, {"prompt": 3}, FP)
    with pytest.raises(InvalidInput):
        record_keys(CHAT, {"prompt": "x"}, FP)
    with pytest.raises(InvalidInput):
        record_keys(COMPLETIONS, ["not", "an", "object"], FP)  # type: ignore[arg-type]


# Parameters whose values are equal in Python but not in a key (1, 1.0 and True; 0 and False;
# "1" and 1), and containers the parameter memo must key by content.
_LOOKALIKES = st.sampled_from([0, 0.0, False, 1, 1.0, True, -0.0, "1", None, 0.5, [], ["a"], [1]])


@given(
    st.dictionaries(
        st.sampled_from(["temperature", "top_k", "n", "seed", "ignore_eos", "x_unknown"]),
        _LOOKALIKES,
        max_size=4,
    ),
    st.sampled_from([COMPLETIONS, CHAT]),
)
def test_remembered_parameters_give_the_key_computed_afresh(
    p: dict[str, Any], endpoint: str
) -> None:
    """Keys computed after other requests (the head of each parameter set is remembered)
    equal the reference hash of the whole document, whatever was computed before."""
    prompt_member = {"prompt": "hi"} if endpoint == COMPLETIONS else {"messages": []}
    request = {**prompt_member, **p}
    prompt = {"text": "hi"} if endpoint == COMPLETIONS else {"messages": [], "chat_template": None}
    try:
        expected = reference_key(endpoint, request, FP, prompt)
    except InvalidInput:
        with pytest.raises(InvalidInput):
            cache_key(endpoint, request, FP)
        with pytest.raises(InvalidInput):  # a refusal is never remembered as a head
            cache_key(endpoint, request, FP)
        return
    assert cache_key(endpoint, request, FP) == expected
    assert cache_key(endpoint, request, FP) == expected  # now from the memo
    assert cache_key(endpoint, request, FP2) != expected


def test_remembered_parameters_are_a_snapshot() -> None:
    """A parameter list changed after its key was computed gives the new key."""
    request = {"prompt": "hi", "stop": ["a"], "temperature": 0.5}
    first = key(request)
    request["stop"].append("b")
    assert key(request) != first
    assert key(request) == reference_key(COMPLETIONS, request, FP, {"text": "hi"})
    assert key({"prompt": "hi", "stop": ["a"], "temperature": 0.5}) == first


def test_prompt_token_ids_must_be_the_token_id_prompt_vllm_runs() -> None:
    """Beside a prompt of token IDs, ``prompt_token_ids`` are those IDs, or with
    ``truncate_prompt_tokens`` their last ones (vLLM keeps the end); anything else is another
    prompt's key, refused."""
    fp = "sha256:" + "ab" * 32
    ids = {"prompt": [1, 2, 3, 11, 12, 13], "temperature": 0}
    assert cache_key(COMPLETIONS, ids, fp, prompt_token_ids=[1, 2, 3, 11, 12, 13])
    with pytest.raises(InvalidInput) as err:
        cache_key(COMPLETIONS, ids, fp, prompt_token_ids=[11, 12, 13])
    assert err.value.code == "invalid_request"
    cut = {**ids, "truncate_prompt_tokens": 3}
    assert cache_key(COMPLETIONS, cut, fp, prompt_token_ids=[11, 12, 13])
    with pytest.raises(InvalidInput):
        cache_key(COMPLETIONS, cut, fp, prompt_token_ids=[1, 2, 3])
    # a text prompt: the IDs are the engine's reading of it, which the ledger cannot check
    assert cache_key(COMPLETIONS, {"prompt": "x", "temperature": 0}, fp, prompt_token_ids=[9])
