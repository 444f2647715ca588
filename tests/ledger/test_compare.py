"""Replay comparison: every verdict and edge, plus properties (hypothesis)."""

from __future__ import annotations

import json
import math
import struct

from hypothesis import given
from hypothesis import strategies as st

from ledger.canonical import canonicalize
from ledger.compare import (
    BITWISE,
    DIVERGED,
    LOGPROBS_DRIFT,
    PROMPT_MISMATCH,
    Generation,
    Output,
    compare,
    float32_bits,
    same_bits,
)

PROMPT = [1, 2, 3]


def gen(*choices: Output, prompt: list[int] = PROMPT) -> Generation:
    return Generation(prompt, list(choices))


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def test_identical_outputs_are_bitwise() -> None:
    out = Output([5, 6, 7], [-0.5, -1.25, -2.0])
    result = compare(gen(out), gen(Output([5, 6, 7], [-0.5, -1.25, -2.0])))
    assert result.verdict == BITWISE
    assert result.first_divergence is None
    (c,) = result.choices
    assert (c.logprobs_compared, c.logprobs_differing, c.max_abs_logprob_delta) == (3, 0, 0.0)


def test_one_ulp_drift_is_reported_with_its_position_and_size() -> None:
    a = f32(-1.25)
    b = struct.unpack("<f", struct.pack("<I", float32_bits(a) + 1))[0]
    result = compare(gen(Output([5, 6], [-0.5, a])), gen(Output([5, 6], [-0.5, b])))
    assert result.verdict == LOGPROBS_DRIFT
    (c,) = result.choices
    assert c.tokens_equal and c.first_logprob_difference == 1 and c.logprobs_differing == 1
    assert c.max_abs_logprob_delta == abs(a - b) > 0


def test_negative_zero_differs_from_zero() -> None:
    assert not same_bits(0.0, -0.0)
    result = compare(gen(Output([5], [0.0])), gen(Output([5], [-0.0])))
    assert result.verdict == LOGPROBS_DRIFT
    assert result.choices[0].max_abs_logprob_delta == 0.0  # equal as numbers, not as bits


def test_nan_is_never_equal_even_to_itself() -> None:
    nan = float("nan")
    assert not same_bits(nan, nan)
    result = compare(gen(Output([5], [nan])), gen(Output([5], [nan])))
    assert result.verdict == LOGPROBS_DRIFT
    assert result.choices[0].max_abs_logprob_delta == math.inf
    assert result.to_dict()["choices"][0]["max_abs_logprob_delta"] is None


def test_token_divergence_names_the_position_margin_and_prefix_delta() -> None:
    recorded = Output(
        [5, 6, 7, 8],
        [-0.1, -0.2, -0.3, -0.4],
        top_logprobs=[[-0.1, -3.0], [-0.2, -2.0], [-0.3, -0.31], [-0.4, -5.0]],
    )
    replayed = Output([5, 6, 9, 8], [-0.1, -0.25, -0.29, -0.4])
    result = compare(gen(recorded), gen(replayed))
    assert result.verdict == DIVERGED
    (c,) = result.choices
    assert c.first_divergence == 2 and result.first_divergence == 2
    assert c.top2_margin_at_divergence is not None
    assert math.isclose(c.top2_margin_at_divergence, 0.01, rel_tol=1e-6)
    assert c.logprobs_compared == 2  # the common prefix only
    assert math.isclose(c.max_abs_logprob_delta or 0, 0.05, rel_tol=1e-6)


def test_figures_without_an_exact_json_form_are_null_and_the_report_signable() -> None:
    """float32 logprobs near -1e17 are accepted (finite): the delta and the margin between them
    are integral floats RFC 8785 writes as integers beyond 2**53, which no signed document can
    hold. They are reported as null, so the verdict is still signed and logged."""
    far = f32(-1e17)
    recorded = Output([5, 6], [far, -0.5], top_logprobs=[[-0.0, far], [-0.0, far]])
    replayed = Output([5, 7], [-0.25, -0.5])
    result = compare(gen(recorded), gen(replayed))
    (c,) = result.choices
    assert c.max_abs_logprob_delta is not None and c.max_abs_logprob_delta > 2**53
    assert c.top2_margin_at_divergence is not None and c.top2_margin_at_divergence > 2**53
    report = result.to_dict()["choices"][0]
    assert report["max_abs_logprob_delta"] is None
    assert report["top2_margin_at_divergence"] is None
    canonicalize(result.to_dict())


def test_shorter_replay_diverges_where_it_stops() -> None:
    result = compare(gen(Output([5, 6, 7], [-1, -1, -1])), gen(Output([5, 6], [-1, -1])))
    assert result.verdict == DIVERGED
    c = result.choices[0]
    assert (c.first_divergence, c.recorded_tokens, c.replayed_tokens) == (2, 3, 2)
    assert c.logprobs_differing == 0


def test_longer_replay_diverges_too() -> None:
    result = compare(gen(Output([5], [-1])), gen(Output([5, 6], [-1, -2])))
    assert result.verdict == DIVERGED and result.first_divergence == 1


def test_a_cut_record_is_compared_by_what_it_recorded() -> None:
    """``cut`` (an aborted record): the replay's tokens past the recorded ones are not
    compared, and a choice the record never began is no divergence; inside what the record
    holds, everything counts as before."""
    whole = Output([5, 6, 7], [-1, -2, -3])
    recorded = gen(Output([5, 6], [-1, -2]))
    assert compare(recorded, gen(whole), cut=True).verdict == BITWISE
    assert compare(recorded, gen(whole)).verdict == DIVERGED
    two = gen(whole, Output([8], [-1]))
    assert compare(recorded, two, cut=True).verdict == BITWISE
    assert compare(recorded, two).verdict == DIVERGED
    shorter = compare(recorded, gen(Output([5], [-1])), cut=True)
    assert shorter.verdict == DIVERGED and shorter.first_divergence == 1
    other = compare(recorded, gen(Output([5, 9, 7], [-1, -2, -3])), cut=True)
    assert other.verdict == DIVERGED and other.first_divergence == 1
    drift = compare(recorded, gen(Output([5, 6, 7], [-1, -2.5, -3])), cut=True)
    assert drift.verdict == LOGPROBS_DRIFT
    assert compare(gen(whole, whole), gen(whole), cut=True).verdict == DIVERGED


def test_empty_outputs_are_bitwise() -> None:
    assert compare(gen(Output([], [])), gen(Output([], []))).verdict == BITWISE
    assert compare(gen(Output([])), gen(Output([]))).verdict == BITWISE


def test_empty_versus_nonempty_diverges_at_zero() -> None:
    result = compare(gen(Output([], [])), gen(Output([4], [-1])))
    assert result.verdict == DIVERGED and result.first_divergence == 0


def test_missing_logprobs_cannot_be_bitwise() -> None:
    result = compare(gen(Output([5, 6], None)), gen(Output([5, 6], [-1, -2])))
    assert result.verdict == LOGPROBS_DRIFT
    assert result.choices[0].logprobs_compared == 0


def test_prompt_mismatch_wins_over_everything() -> None:
    out = Output([5], [-1])
    result = compare(gen(out), gen(out, prompt=[1, 2, 4]))
    assert result.verdict == PROMPT_MISMATCH and not result.prompt_equal


def test_missing_choice_diverges() -> None:
    a, b = Output([5], [-1]), Output([6], [-1])
    result = compare(gen(a, b), gen(Output([5], [-1])))
    assert result.verdict == DIVERGED
    assert result.choice_count == (2, 1)
    assert result.choices[1].first_divergence == 0 and result.choices[1].replayed_tokens == 0


def test_worst_choice_decides_and_report_is_signable() -> None:
    result = compare(
        gen(Output([5], [-1.0]), Output([6], [-1.0])),
        gen(Output([5], [-1.0]), Output([6], [-1.5])),
    )
    assert [c.verdict for c in result.choices] == [BITWISE, LOGPROBS_DRIFT]
    assert result.verdict == LOGPROBS_DRIFT
    # the report goes into a signed verdict: it must canonicalize (no NaN, no infinity)
    report = json.loads(canonicalize(result.to_dict()))
    assert report["choices"][1]["first_logprob_difference"] == 0
    assert report["verdict"] == LOGPROBS_DRIFT


float32s = st.floats(width=32, allow_nan=False, allow_infinity=False)
outputs = st.lists(st.tuples(st.integers(0, 511), float32s), max_size=20).map(
    lambda pairs: Output([t for t, _ in pairs], [lp for _, lp in pairs])
)


@given(outputs)
def test_property_any_output_reproduces_itself(out: Output) -> None:
    copy = Output(list(out.token_ids), list(out.logprobs or []))
    assert compare(gen(out), gen(copy)).verdict == BITWISE


@given(outputs, st.data())
def test_property_changing_one_token_diverges_there(out: Output, data: st.DataObject) -> None:
    if not out.token_ids:
        return
    i = data.draw(st.integers(0, len(out.token_ids) - 1))
    ids = list(out.token_ids)
    ids[i] = (ids[i] + 1) % 512
    result = compare(gen(out), gen(Output(ids, out.logprobs)))
    assert result.verdict == DIVERGED and result.first_divergence == i


@given(outputs, st.data())
def test_property_changing_one_logprob_bit_drifts(out: Output, data: st.DataObject) -> None:
    if not out.token_ids:
        return
    assert out.logprobs is not None
    i = data.draw(st.integers(0, len(out.token_ids) - 1))
    bit = data.draw(st.integers(0, 31))
    values = list(out.logprobs)
    flipped = struct.unpack("<f", struct.pack("<I", float32_bits(values[i]) ^ (1 << bit)))[0]
    values[i] = flipped
    result = compare(gen(out), gen(Output(out.token_ids, values)))
    assert result.verdict == LOGPROBS_DRIFT
    assert result.choices[0].first_logprob_difference == i


@given(outputs, outputs)
def test_property_verdict_is_symmetric_in_kind(a: Output, b: Output) -> None:
    ab, ba = compare(gen(a), gen(b)), compare(gen(b), gen(a))
    assert ab.verdict == ba.verdict
    assert ab.first_divergence == ba.first_divergence
