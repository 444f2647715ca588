"""Tier policy: what each tier needs, and refusals that name the missing condition."""

from __future__ import annotations

import pytest

from collectors.tiers import check_tier, missing_conditions, parse_tier
from collectors.vllm_request import Unsure
from ledger.errors import Conflict, InvalidInput


@pytest.mark.parametrize(
    ("tier", "body", "invariance", "accepted"),
    [
        (0, {"temperature": 1.3}, "none", True),
        (0, {}, "none", True),
        (1, {"temperature": 0}, "none", True),
        (1, {"temperature": 0.7, "seed": 1}, "none", True),
        (1, {"temperature": 0.7}, "none", False),
        (1, {}, "none", False),  # the OpenAI default temperature is 1
        (1, {"seed": 0}, "none", True),
        (2, {"temperature": 0}, "serial", True),
        (2, {"temperature": 0.9, "seed": 3}, "kernel", True),
        (2, {"temperature": 0}, "none", False),
        (2, {"temperature": 0.9}, "serial", False),
        # As vLLM reads them: the same at every tier.
        (1, {"temperature": "0"}, "none", True),
        (1, {"temperature": " 0.0 "}, "none", True),
        (1, {"temperature": "0.7"}, "none", False),
        (1, {"temperature": "0.7", "seed": "5"}, "none", True),
        (2, {"temperature": False}, "serial", True),
        # vLLM reads seed -1 as no seed: random sampling
        (1, {"temperature": 0.7, "seed": -1}, "none", False),
        (1, {"temperature": 0.7, "seed": "-1"}, "none", False),
        (1, {"temperature": 0, "seed": -1}, "none", True),
    ],
)
def test_each_case(tier: int, body: dict, invariance: str, accepted: bool):
    assert (missing_conditions(tier, body, invariance) == []) is accepted


def test_a_refusal_names_every_missing_condition():
    with pytest.raises(Conflict) as err:
        check_tier(2, {"temperature": 0.5}, "none")
    assert err.value.code == "tier_refused"
    missing = err.value.details["missing"]
    assert len(missing) == 2
    assert "temperature 0, or a seed" in missing[0] and "batch_invariance 'none'" in missing[1]
    assert "tier 2 refused" in err.value.message


@pytest.mark.parametrize("header", ["3", "-1", "two", "1.0"])
def test_bad_tier_headers(header: str):
    with pytest.raises(InvalidInput) as err:
        parse_tier(header, 0)
    assert err.value.code == "invalid_tier"


def test_a_request_sent_on_unchanged_is_held_to_its_tier_if_vllm_answers_it():
    from collectors.tiers import refusal_if_answered

    assert refusal_if_answered(0, {"temperature": "1_000"}, "none") is None
    assert refusal_if_answered(1, {"temperature": "1_000", "seed": 2}, "none") is None
    assert refusal_if_answered(1, {"temperature": 0, "echo": "?"}, "none") is None
    for body in ({"temperature": "1_000"}, None, {"seed": "1_0"}):
        refusal = refusal_if_answered(1, body, "none")
        assert refusal is not None and refusal.code == "tier_refused"
    refusal = refusal_if_answered(2, {"temperature": 0}, "none")
    assert refusal is not None and "batch-invariant" in refusal.message


def test_header_and_default():
    assert parse_tier(None, 1) == 1 and parse_tier(" 2 ", 0) == 2 and parse_tier("", 2) == 2
    # vLLM refuses it: the proxy forwards it unchanged, at every tier, for vLLM to answer.
    for tier in (1, 2):
        with pytest.raises(Unsure):
            missing_conditions(tier, {"temperature": "hot"}, "serial")
