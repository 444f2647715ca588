"""Replay documents, certification figures and the evidence check of replay verdicts."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from ledger import certify
from ledger.compare import BITWISE, DIVERGED, Generation, Output, compare
from ledger.errors import InvalidInput
from ledger.records import Choice
from ledger.replay import (
    ReplayedChoice,
    build_order,
    build_output,
    build_verdict,
    check_order,
    check_output,
    output_generation,
)


def new_order() -> dict:
    """Issued now: an order is only good for a few minutes."""
    return build_order(
        replay_id="rpl-1",
        request_id="req-1",
        worker_id="w1",
        endpoint="/v1/completions",
        request_raw="e30=",
    )


def test_an_order_is_for_one_worker_and_expires() -> None:
    order = new_order()
    assert check_order(order, "w1")["request_id"] == "req-1"
    with pytest.raises(InvalidInput, match="for worker"):
        check_order(order, "w2")
    later = datetime.now(UTC) + timedelta(minutes=6)
    with pytest.raises(InvalidInput, match="too old"):
        check_order(order, "w1", now=later)
    with pytest.raises(InvalidInput, match="endpoint"):
        check_order({**order, "endpoint": "/v1/embeddings"}, "w1")
    with pytest.raises(InvalidInput, match="lacks"):
        check_order({k: v for k, v in order.items() if k != "request_raw"}, "w1")


def _output(margins: list[float] | None) -> dict:
    return build_output(
        order=new_order(),
        fingerprint_id="sha256:" + "a" * 64,
        prompt_token_ids=[1, 2, 3],
        choices=[ReplayedChoice(Choice([4, 5], [-0.5, -1.5], finish_reason="length"), margins)],
        system_fingerprint=None,
        started_at="2026-11-29T00:00:00Z",
        total_ns=1000,
    )


def test_output_round_trips_into_a_generation_with_margins() -> None:
    body = check_output(_output([0.25, 3.0]))
    generation = output_generation(body)
    assert list(generation.prompt_token_ids) == [1, 2, 3]
    (out,) = generation.choices
    assert list(out.token_ids) == [4, 5] and list(out.logprobs or []) == [-0.5, -1.5]
    assert out.top_logprobs is not None
    assert [row[0] - row[1] for row in out.top_logprobs] == [0.25, 3.0]
    assert "margins" not in _output(None)["choices"][0]


def test_output_with_bad_margins_is_refused() -> None:
    body = _output([0.25, 3.0])
    body["choices"][0]["margins"] = body["choices"][0]["logprobs"][:8]
    with pytest.raises(InvalidInput, match="margins"):
        check_output(body)


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("fingerprint_id", {"x": 1}),
        ("fingerprint_id", 12),
        ("fingerprint_id", "not-a-fingerprint"),
        ("fingerprint_id", "sha256:" + "A" * 64),
        ("worker_id", ["w1"]),
        ("replay_id", ""),
        ("system_fingerprint", {"nested": [[[]]]}),
        ("system_fingerprint", "x" * 1001),
        ("timings", {"started_at": "t", "total_ns": "1", "extra": [[[[]]]]}),
        ("timings", {"started_at": "t", "total_ns": 5}),
        ("timings", {"started_at": "t", "total_ns": "-1"}),
        ("unexpected", [[[[[[]]]]]]),
    ],
)
def test_an_output_member_of_the_wrong_type_or_form_is_refused(member: str, value: object):
    """A replay output is embedded in a log-signed verdict: a collector cannot slip a
    free-form or nested value into it, nor an identifier the ledger cannot read (which made
    the replay route answer 500 and log no verdict)."""
    body = {**_output(None), member: value}
    with pytest.raises(InvalidInput) as err:
        check_output(body)
    assert err.value.code == "invalid_replay_document"


def test_verdict_names_only_known_verdicts() -> None:
    args = dict(
        replay_id="rpl-1",
        request_id="req-1",
        record={},
        pool="p",
        worker_id="w",
        worker_key_id="ed25519:k",
        worker_fingerprint_id="sha256:x",
        forced=False,
        reason=None,
        comparison=None,
        fingerprint_diff=None,
        output=None,
    )
    made = build_verdict(**args, verdict="error")
    assert made["verdict"] == "error" and made["worker_key_id"] == "ed25519:k"
    with pytest.raises(InvalidInput):
        build_verdict(**args, verdict="maybe")


def test_a_verdict_embeds_only_output_signed_by_the_workers_key() -> None:
    args = dict(
        replay_id="rpl-1",
        request_id="req-1",
        record={},
        pool="p",
        worker_id="w",
        worker_key_id="ed25519:bound",
        worker_fingerprint_id="sha256:x",
        forced=False,
        verdict="bitwise",
        reason=None,
        comparison=None,
        fingerprint_diff=None,
    )
    output = {"kind": "replay_output", "body": {}, "signature": {"key_id": "ed25519:other"}}
    with pytest.raises(InvalidInput, match="not by the worker's key"):
        build_verdict(**args, output=output)
    output["signature"]["key_id"] = "ed25519:bound"
    assert build_verdict(**args, output=output)["output"] is output


def test_probe_prompts_are_seeded_mixed_and_within_budget() -> None:
    probes = certify.probe_prompts(9, seed=3, char_budget=120)
    assert probes == certify.probe_prompts(9, seed=3, char_budget=120)
    assert probes != certify.probe_prompts(9, seed=4, char_budget=120)
    assert [p.kind for p in probes[:3]] == ["short", "medium", "long"]
    assert all(0 < len(p.text) <= 120 for p in probes)
    assert max(len(p.text) for p in probes if p.kind == "long") > 100
    assert all(p.text.isascii() for p in probes)
    request = certify.probe_request(probes[0], 16, "fixture")
    assert request["temperature"] == 0 and request["logprobs"] == 2 and request["ignore_eos"]


def _probe_texts_as_first_written(count: int, seed: int, budget: int) -> list[str]:
    """probe_prompts' texts as its first version built them, re-joining the words for every
    word added (quadratic): the prompts a certification's seed stands for must not change."""
    rng = random.Random(seed)
    budgets = {"short": min(24, budget), "medium": min(160, budget), "long": max(budget, 1)}
    texts = []
    for i in range(count):
        kind = ("short", "medium", "long")[i % 3]
        words: list[str] = []
        limit = budgets[kind] if kind == "long" else rng.randint(budgets[kind] // 2, budgets[kind])
        while True:
            word = rng.choice(certify._WORDS)
            if len(" ".join([*words, word])) > limit:
                break
            words.append(word)
        texts.append(" ".join(words) or rng.choice(certify._WORDS)[: max(limit, 1)])
    return texts


@pytest.mark.parametrize(("seed", "budget"), [(0, 1), (1, 5), (3, 120), (7, 2000), (11, 40)])
def test_probe_prompts_are_those_a_seed_always_gave(seed: int, budget: int) -> None:
    got = [p.text for p in certify.probe_prompts(12, seed=seed, char_budget=budget)]
    assert got == _probe_texts_as_first_written(12, seed, budget)


def test_cell_figures_and_the_certificate_verdict() -> None:
    base = Generation(
        [1], [Output([5, 6, 7], [-1.0, -2.0, -3.0], [[0, -0.5], [0, -0.01], [0, -2]])]
    )
    same = Generation([1], [Output([5, 6, 7], [-1.0, -2.0, -3.0])])
    forked = Generation([1], [Output([5, 9, 7], [-1.0, -2.5, -3.0])])
    comparisons = [compare(base, same), compare(base, forked)]
    assert [c.verdict for c in comparisons] == [BITWISE, DIVERGED]
    cell = certify.cell(16, 8, comparisons, [base])
    assert cell["requests"] == 2 and cell["bitwise"] == 1 and cell["exact_tokens"] == 1
    assert cell["bitwise_rate"] == 0.5 and cell["first_divergences"] == [1]
    assert cell["min_margin"] == 0.01 and cell["min_margin_at_divergence"] == 0.01
    cert = certify.certificate(
        certificate_id="c",
        pool="p",
        worker_id="w",
        fingerprint_id="f",
        batch_invariance="none",
        parameters={},
        results=[cell],
    )
    assert cert["invariant_observed"] is False
    clean = certify.cell(16, 1, [comparisons[0]], [base])
    assert (
        certify.certificate(
            certificate_id="c",
            pool="p",
            worker_id="w",
            fingerprint_id="f",
            batch_invariance="serial",
            parameters={},
            results=[clean],
        )["invariant_observed"]
        is True
    )
    empty = certify.certificate(
        certificate_id="c",
        pool="p",
        worker_id="w",
        fingerprint_id="f",
        batch_invariance="serial",
        parameters={},
        results=[],
    )
    assert empty["invariant_observed"] is False
