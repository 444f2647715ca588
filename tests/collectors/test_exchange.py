"""What the collector asks the engine for, and what it hands back and records."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from collectors.exchange import CHAT, COMPLETIONS, Accumulator, ClientView, dumps, plan
from collectors.tokens import TokenRenderer
from ledger.errors import InvalidInput


def sent(view: ClientView, data: dict[str, Any]) -> Any:
    """What the client reads: the shaped answer as the collector writes it, parsed."""
    return json.loads(dumps(view.shape(data)))


def test_completions_plan_adds_ids_and_sampled_logprobs_only_when_missing():
    p = plan(COMPLETIONS, {"model": "m", "prompt": "hi"})
    assert p.engine_body["return_token_ids"] is True and p.engine_body["logprobs"] == 0
    assert p.hide_token_ids and p.hide_logprobs
    asked = plan(
        COMPLETIONS, {"model": "m", "prompt": [1, 2], "logprobs": 3, "return_token_ids": True}
    )
    assert asked.engine_body["logprobs"] == 3
    assert not asked.hide_token_ids and not asked.hide_logprobs


def test_chat_plan():
    p = plan(CHAT, {"model": "m", "messages": []})
    assert p.engine_body["logprobs"] is True and p.engine_body["top_logprobs"] == 0
    asked = plan(CHAT, {"model": "m", "messages": [], "logprobs": True, "top_logprobs": 2})
    assert asked.engine_body["top_logprobs"] == 2 and not asked.hide_logprobs


@pytest.mark.parametrize("prompt", [["a", "b"], [[1, 2], [3]]])
def test_one_prompt_per_request(prompt):
    with pytest.raises(InvalidInput) as err:
        plan(COMPLETIONS, {"model": "m", "prompt": prompt})
    assert err.value.code == "one_prompt_per_request"


@pytest.mark.parametrize("prompt", [["one"], [[1, 2]]])
def test_a_list_of_one_prompt_is_one_prompt(prompt):
    """vLLM answers a one-item list as that one prompt (one choice); so does the collector."""
    assert plan(COMPLETIONS, {"model": "m", "prompt": prompt}).engine_body["prompt"] == prompt


def test_for_client_nulls_only_what_was_added():
    p = plan(COMPLETIONS, {"model": "m", "prompt": "hi"})
    engine = {
        "id": "x",
        "choices": [
            {
                "index": 0,
                "text": "a",
                "logprobs": {"token_logprobs": [-1.0]},
                "token_ids": [5],
                "prompt_token_ids": [1, 2],
            }
        ],
        "usage": {"completion_tokens": 1},
    }
    out = sent(ClientView(p), engine)
    assert out["choices"][0] == {
        "index": 0,
        "text": "a",
        "logprobs": None,
        "token_ids": None,
        "prompt_token_ids": None,
    }
    assert engine["choices"][0]["token_ids"] == [5]  # the engine's data is not modified
    chunk = {"choices": [{"index": 0, "delta": {"role": "assistant"}}], "prompt_token_ids": [1]}
    chat = sent(ClientView(plan(CHAT, {"model": "m", "messages": []})), chunk)
    assert chat == {
        "choices": [{"index": 0, "delta": {"role": "assistant"}}],
        "prompt_token_ids": None,
    }


def test_accumulator_reads_a_stream_with_echo_and_n2():
    acc = Accumulator(COMPLETIONS)
    acc.feed(
        {
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "prompt_token_ids": [1, 2],
                    "token_ids": [7],
                    "logprobs": {"token_logprobs": [None, -0.5, -1.25]},
                },  # echo: prompt first
                {"index": 1, "text": "x", "token_ids": [8], "logprobs": {"token_logprobs": [-2.0]}},
            ],
        }
    )
    acc.feed(
        {
            "choices": [
                {
                    "index": 0,
                    "text": "y",
                    "token_ids": [9],
                    "logprobs": {"token_logprobs": [-0.75]},
                    "finish_reason": "length",
                }
            ],
            "system_fingerprint": "vllm-x",
        }
    )
    choices = acc.record_choices()
    assert acc.prompt_token_ids == [1, 2] and acc.system_fingerprint == "vllm-x"
    assert choices[0].token_ids == [7, 9] and choices[0].logprobs == [-1.25, -0.75]
    assert choices[0].finish_reason == "length" and choices[0].text == "y"
    assert choices[1].token_ids == [8] and choices[1].logprobs == [-2.0]


def test_missing_logprobs_are_not_invented():
    acc = Accumulator(CHAT)
    acc.feed(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {"content": "hi"},
                    "token_ids": [4, 5],
                    "logprobs": {"content": [{"logprob": -1.0}]},
                }
            ]
        }
    )
    assert acc.record_choices()[0].logprobs is None
    assert acc.record_choices()[0].text == "hi"


def test_margins_from_completions_and_chat_top_logprobs() -> None:
    completions = Accumulator("/v1/completions")
    completions.feed(
        {
            "choices": [
                {
                    "index": 0,
                    "token_ids": [5, 6],
                    "logprobs": {
                        "token_logprobs": [-0.1, -0.7],
                        "top_logprobs": [{"a": -0.1, "b": -2.1}, {"c": -0.5, "d": -0.7, "e": -3}],
                    },
                }
            ]
        }
    )
    assert completions.margins() == [pytest.approx([2.0, 0.2])]
    chat = Accumulator("/v1/chat/completions")
    chat.feed(
        {
            "choices": [
                {
                    "index": 0,
                    "token_ids": [5],
                    "logprobs": {
                        "content": [
                            {
                                "logprob": -0.25,
                                "top_logprobs": [
                                    {"token": "x", "logprob": -0.25},
                                    {"token": "y", "logprob": -1.25},
                                ],
                            }
                        ]
                    },
                }
            ]
        }
    )
    assert chat.margins() == [[1.0]]
    # one alternative only: no margin, rather than a wrong one
    lone = Accumulator("/v1/completions")
    lone.feed(
        {
            "choices": [
                {
                    "index": 0,
                    "token_ids": [5],
                    "logprobs": {"token_logprobs": [-0.1], "top_logprobs": [{"a": -0.1}]},
                }
            ]
        }
    )
    assert lone.margins() == [None]


def test_top_k_ids_are_asked_only_where_they_can_be_recorded_and_rendered():
    def ask(endpoint, body, can_render=True):
        p = plan(endpoint, body, can_render=can_render)
        return p.top_k, p.render_tokens, p.engine_body.get("return_tokens_as_token_ids")

    prompt = {"model": "m", "prompt": "hi"}
    assert ask(COMPLETIONS, {**prompt, "logprobs": 3}) == (3, True, True)
    assert ask(COMPLETIONS, {**prompt, "logprobs": 0}) == (0, False, None)
    assert ask(COMPLETIONS, {**prompt}) == (0, False, None)
    # echoed prompts, prompt logprobs and fixed-ID scores share the list: not recorded
    assert ask(COMPLETIONS, {**prompt, "logprobs": 3, "echo": True}) == (0, False, None)
    assert ask(COMPLETIONS, {**prompt, "logprobs": 3, "prompt_logprobs": 1}) == (0, False, None)
    assert ask(COMPLETIONS, {**prompt, "logprobs": 3, "logprob_token_ids": [5]})[0] == 0
    # no renderer for the model: the client's strings stay vLLM's, no IDs recorded
    assert ask(COMPLETIONS, {**prompt, "logprobs": 3}, can_render=False) == (0, False, None)
    # the client wants token IDs itself: recorded, nothing to render
    own = {**prompt, "logprobs": 3, "return_tokens_as_token_ids": True}
    assert ask(COMPLETIONS, own, can_render=False) == (3, False, True)
    chat = {"model": "m", "messages": []}
    assert ask(CHAT, {**chat, "logprobs": True, "top_logprobs": 2}) == (2, True, True)
    assert ask(CHAT, {**chat, "logprobs": True}) == (0, False, None)
    assert ask(CHAT, {**chat, "logprobs": False, "top_logprobs": 2}) == (0, False, None)
    assert ask(CHAT, {**chat, "logprobs": True, "top_logprobs": -1}) == (0, False, None)
    # vLLM's model reads true as 1 (lax int), and so does the collector
    assert ask(CHAT, {**chat, "logprobs": True, "top_logprobs": True}) == (1, True, True)
    assert ask(CHAT, {**chat, "logprobs": "true", "top_logprobs": 2}) == (2, True, True)


def _completion_row(ids_and_values):
    return {f"token_id:{t}": v for t, v in ids_and_values}


def test_accumulator_keeps_top_k_ids_highest_first():
    acc = Accumulator(COMPLETIONS, top_k=2)
    acc.feed(
        {
            "choices": [
                {
                    "index": 0,
                    "token_ids": [7, 9],
                    "logprobs": {
                        "tokens": ["token_id:7", "token_id:9"],
                        "token_logprobs": [-0.5, -2.0],
                        "top_logprobs": [
                            # sampled token in the top-k: listed first, k entries
                            _completion_row([(7, -0.5), (3, -0.25)]),
                            # sampled outside the top-k: k + 1 entries, it is dropped
                            _completion_row([(9, -2.0), (4, -0.1), (5, -0.1)]),
                        ],
                    },
                }
            ]
        }
    )
    choice = acc.record_choices()[0]
    assert choice.top_k_ids == [[3, 7], [4, 5]]
    assert choice.top_k_logprobs == [[-0.25, -0.5], [-0.1, -0.1]]


def test_chat_top_k_and_incomplete_rows():
    acc = Accumulator(CHAT, top_k=2)
    item = {
        "token": "token_id:7",
        "logprob": -0.5,
        "top_logprobs": [
            {"token": "token_id:7", "logprob": -0.5},
            {"token": "token_id:8", "logprob": -0.5},  # a tie keeps the engine's order
        ],
    }
    acc.feed({"choices": [{"index": 0, "token_ids": [7], "logprobs": {"content": [item]}}]})
    assert acc.record_choices()[0].top_k_ids == [[7, 8]]
    # a row of strings (no IDs) or of the wrong length: no top-k rather than a wrong one
    for bad in (
        [{"token": "a", "logprob": -0.5}, {"token": "token_id:8", "logprob": -1.0}],
        [{"token": "token_id:7", "logprob": -0.5}],
    ):
        acc = Accumulator(CHAT, top_k=2)
        row = {**item, "top_logprobs": bad}
        acc.feed({"choices": [{"index": 0, "token_ids": [7], "logprobs": {"content": [row]}}]})
        assert acc.record_choices()[0].top_k_ids is None


@pytest.fixture(scope="module")
def renderer(tmp_path_factory):
    from fixture_model.tokenizer import train

    model_dir = tmp_path_factory.mktemp("tokenizer")
    train(512).save(str(model_dir / "tokenizer.json"))
    made = TokenRenderer.from_model_dir(model_dir)
    assert made is not None
    return made


def test_client_view_renders_completion_tokens_across_chunks(renderer):
    p = plan(COMPLETIONS, {"model": "m", "prompt": "x", "logprobs": 1}, can_render=True)
    view = ClientView(p, renderer)
    a, b = 40, 41  # two single-character tokens of the fixture vocabulary
    ta, tb = renderer.decode([a]), renderer.decode([b])

    def chunk(token_id):
        return {
            "choices": [
                {
                    "index": 0,
                    "token_ids": [token_id],
                    "logprobs": {
                        "text_offset": [999],
                        "tokens": [f"token_id:{token_id}"],
                        "token_logprobs": [-0.5],
                        "top_logprobs": [_completion_row([(token_id, -0.5), (b, -1.0)])],
                    },
                }
            ]
        }

    first = sent(view, chunk(a))["choices"][0]
    second = sent(view, chunk(b))["choices"][0]
    assert first["logprobs"]["tokens"] == [ta] and first["logprobs"]["text_offset"] == [0]
    assert first["logprobs"]["top_logprobs"] == [{ta: -0.5, tb: -1.0}]
    # the offset runs on from the previous chunk; two IDs rendering alike collapse as in vLLM
    assert second["logprobs"]["text_offset"] == [len(ta)]
    assert second["logprobs"]["top_logprobs"] == [{tb: -1.0}]
    assert first["token_ids"] is None  # the client did not ask for token IDs


def test_client_view_repairs_split_characters_and_trusts_chat_bytes(renderer):
    from fixture_model.tokenizer import train

    lead, trail = train(512).encode("é", add_special_tokens=False).ids  # byte pieces C3, A9
    assert renderer.decode([lead]) == "\ufffd"
    body = {"model": "m", "messages": [], "logprobs": True, "top_logprobs": 1}
    view = ClientView(plan(CHAT, body, can_render=True), renderer)

    def chunk(token_id, sent):
        item = {
            "token": f"token_id:{token_id}",
            "logprob": -0.5,
            "bytes": list(sent.encode()),
            "top_logprobs": [
                {"token": f"token_id:{token_id}", "logprob": -0.5, "bytes": [116]},
            ],
        }
        return {"choices": [{"index": 0, "delta": {}, "logprobs": {"content": [item]}}]}

    first = sent(view, chunk(lead, ""))["choices"][0]["logprobs"]["content"][0]
    second = sent(view, chunk(trail, "é"))["choices"][0]["logprobs"]["content"][0]
    # alone the lead byte is an incomplete character (""); after it, the trail completes it
    assert first["token"] == "" and first["top_logprobs"][0]["bytes"] == []
    assert second["token"] == "é" and second["top_logprobs"][0]["token"] == "é"
    assert second["top_logprobs"][0]["bytes"] == list("é".encode())
    assert view.mismatches == 0
    # vLLM's own string (in bytes) wins over a rendering that differs, and is counted
    other = sent(view, chunk(trail, "e"))["choices"][0]["logprobs"]["content"][0]
    assert other["token"] == "e" and view.mismatches == 1


def _chat_chunk(rng: random.Random, k: int, oddity: str | None) -> dict[str, Any]:
    """A streamed chat chunk with one token and ``k`` alternatives, ties likely; ``oddity``
    spoils it in one of the ways the one-pass reader must leave to the general readers."""
    values = sorted(rng.choice([-0.5, -1.25, -2.0, rng.uniform(-9, 0)]) for _ in range(k))[::-1]
    if oddity == "unsorted":
        rng.shuffle(values)
    top = [{"token": f"token_id:{rng.randrange(500)}", "logprob": v, "bytes": []} for v in values]
    item: dict[str, Any] = {"token": "token_id:1", "logprob": values[0] if values else -1.0}
    item["top_logprobs"] = top
    if oddity == "int_logprob":
        item["logprob"] = -1
    elif oddity == "bool_alternative" and top:
        top[-1]["logprob"] = False
    elif oddity == "int_alternative" and top:
        top[-1]["logprob"] = -3
    elif oddity == "text_token" and top:
        top[-1]["token"] = "plain"
    elif oddity == "no_logprob":
        del item["logprob"]
    elif oddity == "two_items":
        item = {"content": [item, dict(item)]}
    content = item.get("content", [item])
    return {
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": {"content": "x"},
                "logprobs": None if oddity == "null_logprobs" else {"content": content},
                "token_ids": [7],
                "finish_reason": None,
            }
        ],
    }


def _completions_chunk(rng: random.Random, k: int, oddity: str | None) -> dict[str, Any]:
    """A completions chunk of two tokens, each row ``k`` alternatives keyed by token string
    (and the sampled token first, when ``oddity`` is "sampled_outside"), or spoiled."""
    positions = 3 if oddity == "echo" else 2
    values, rows = [], []
    for _ in range(positions):
        row = {
            f"token_id:{rng.randrange(500)}": rng.choice([-0.5, -2.0, rng.uniform(-9, 0)])
            for _ in range(k)
        }
        if oddity == "sampled_outside":
            row = {"token_id:999": -12.0, **row}
        values.append(max(row.values()) if row else -1.0)
        rows.append(row)
    if oddity == "int_logprob":
        values[0] = -1
    elif oddity == "int_alternative" and rows[0]:
        rows[0][next(iter(rows[0]))] = -4
    elif oddity == "text_token":
        rows[1]["plain"] = -0.25
    elif oddity == "null_row":
        rows[1] = None  # type: ignore[call-overload]
    elif oddity == "short_logprobs":
        values = values[1:]
    logprobs = {"tokens": ["token_id:7"] * positions, "token_logprobs": values}
    logprobs["top_logprobs"] = rows
    return {
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": "xy",
                "logprobs": None if oddity == "null_logprobs" else logprobs,
                "token_ids": [7, 8],
                "finish_reason": None,
            }
        ],
    }


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("top_k", [0, 1, 2, 5])
def test_one_pass_reading_records_what_the_general_readers_record(
    endpoint: str, top_k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-pass reader (logprobs, margins and alternatives together) is an optimisation
    only: over chunks with ties, unsorted rows and every spoiled shape, the record's choices
    and margins equal those of the general readers alone."""
    if endpoint == CHAT:
        make = _chat_chunk
        oddities = [None, "unsorted", "int_logprob", "bool_alternative", "int_alternative"]
        oddities += ["text_token", "no_logprob", "two_items", "null_logprobs"]
    else:
        make = _completions_chunk
        oddities = [None, "sampled_outside", "echo", "int_logprob", "int_alternative"]
        oddities += ["text_token", "null_row", "short_logprobs", "null_logprobs"]
    fast_taken = 0
    for seed in range(60):
        # a third of the streams clean, a third with another number of alternatives than
        # asked (the sampled token's extra entry among them), a third with spoiled chunks
        rng = random.Random(seed)
        k = top_k if seed % 3 != 1 else rng.choice([1, 2, 3, 6, top_k + 1])
        spoil = 0.3 if seed % 3 == 2 else 0.0
        chunks = [
            make(rng, k, rng.choice(oddities) if rng.random() < spoil else None) for _ in range(12)
        ]
        fast = Accumulator(endpoint, top_k=top_k)
        for chunk in chunks:
            fast.feed(chunk)
            choice = chunk["choices"][0]
            count = len(choice["token_ids"])
            fast_taken += fast._fast_positions(choice["logprobs"], count) is not None
        with monkeypatch.context() as patched:
            patched.setattr(Accumulator, "_fast_positions", lambda *a: None)
            general = Accumulator(endpoint, top_k=top_k)
            for chunk in chunks:
                general.feed(chunk)
        assert fast.record_choices() == general.record_choices(), seed
        assert fast.margins() == general.margins(), seed
    assert fast_taken > 0 or top_k <= 1  # the one-pass reader did run
