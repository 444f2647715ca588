"""What the collector asks the engine for, and what it hands back and records."""

from __future__ import annotations

import pytest

from collectors.exchange import CHAT, COMPLETIONS, Accumulator, for_client, plan
from ledger.errors import InvalidInput


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


@pytest.mark.parametrize("prompt", [["a", "b"], [[1, 2], [3]], None])
def test_one_prompt_per_request(prompt):
    with pytest.raises(InvalidInput) as err:
        plan(COMPLETIONS, {"model": "m", "prompt": prompt})
    assert err.value.code == "one_prompt_per_request"


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
    out = for_client(p, engine)
    assert out["choices"][0] == {
        "index": 0,
        "text": "a",
        "logprobs": None,
        "token_ids": None,
        "prompt_token_ids": None,
    }
    assert engine["choices"][0]["token_ids"] == [5]  # the engine's data is not modified
    chunk = {"choices": [{"index": 0, "delta": {"role": "assistant"}}], "prompt_token_ids": [1]}
    chat = for_client(plan(CHAT, {"model": "m", "messages": []}), chunk)
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
