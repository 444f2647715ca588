"""Replay comparison: does a re-run reproduce a recorded output, bit for bit?

A pure function over token IDs and float32 logprob bits; no I/O. Logprobs are compared as
their float32 bit patterns, so ``-0.0`` and ``0.0`` differ and NaN never equals anything
(not even a NaN with the same bits: it means the engine produced garbage).

Verdicts, from best to worst:

``bitwise``
    same prompt token IDs, same output token IDs in every choice, every logprob's bits equal.
``tokens_match_logprobs_drift``
    same tokens, but some logprob differs (or one side has no logprobs to compare).
``diverged``
    an output token differs (or a choice is longer or missing); ``first_divergence`` says where.
``prompt_mismatch``
    the prompt token IDs differ: the tokenizer or chat template changed, outputs not comparable.

Two more verdicts are set by the replay orchestration, not here: ``not_comparable`` (replayed
on a pool whose fingerprint differs, the comparison is still reported) and ``error``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ledger.canonical import figure

BITWISE = "bitwise"
LOGPROBS_DRIFT = "tokens_match_logprobs_drift"
DIVERGED = "diverged"
PROMPT_MISMATCH = "prompt_mismatch"
NOT_COMPARABLE = "not_comparable"
ERROR = "error"
VERDICTS = (BITWISE, LOGPROBS_DRIFT, DIVERGED, PROMPT_MISMATCH, NOT_COMPARABLE, ERROR)
_RANK = {BITWISE: 0, LOGPROBS_DRIFT: 1, DIVERGED: 2, PROMPT_MISMATCH: 3}


@dataclass(frozen=True)
class Output:
    """One choice of a generation: output token IDs, their logprobs, optional top-k rows."""

    token_ids: Sequence[int]
    logprobs: Sequence[float] | None = None
    top_logprobs: Sequence[Sequence[float]] | None = None  # per position, best first


@dataclass(frozen=True)
class Generation:
    prompt_token_ids: Sequence[int]
    choices: Sequence[Output]


@dataclass(frozen=True)
class ChoiceComparison:
    index: int
    recorded_tokens: int
    replayed_tokens: int
    tokens_equal: bool
    first_divergence: int | None  # first position whose token differs (or where one side ends)
    logprobs_compared: int  # positions of the common prefix whose logprobs were compared
    logprobs_differing: int  # of those, how many differ bitwise
    first_logprob_difference: int | None
    max_abs_logprob_delta: float | None  # over the common prefix; None when none compared
    top2_margin_at_divergence: float | None  # recorded top-1 minus top-2 logprob there
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "recorded_tokens": self.recorded_tokens,
            "replayed_tokens": self.replayed_tokens,
            "tokens_equal": self.tokens_equal,
            "first_divergence": self.first_divergence,
            "logprobs_compared": self.logprobs_compared,
            "logprobs_differing": self.logprobs_differing,
            "first_logprob_difference": self.first_logprob_difference,
            "max_abs_logprob_delta": figure(self.max_abs_logprob_delta),
            "top2_margin_at_divergence": figure(self.top2_margin_at_divergence),
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Comparison:
    verdict: str
    prompt_equal: bool
    prompt_tokens: tuple[int, int]  # recorded, replayed
    choices: tuple[ChoiceComparison, ...]
    choice_count: tuple[int, int]  # recorded, replayed

    @property
    def first_divergence(self) -> int | None:
        found = [c.first_divergence for c in self.choices if c.first_divergence is not None]
        return min(found) if found else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "prompt_equal": self.prompt_equal,
            "prompt_tokens": {"recorded": self.prompt_tokens[0], "replayed": self.prompt_tokens[1]},
            "choice_count": {"recorded": self.choice_count[0], "replayed": self.choice_count[1]},
            "first_divergence": self.first_divergence,
            "choices": [c.to_dict() for c in self.choices],
        }


def float32_bits(value: float) -> int:
    """The IEEE 754 binary32 bit pattern of ``value`` (rounded to float32 first)."""
    return int(struct.unpack("<I", struct.pack("<f", value))[0])


def same_bits(a: float, b: float) -> bool:
    """Bitwise float32 equality; NaN is never equal, -0.0 differs from 0.0."""
    if math.isnan(a) or math.isnan(b):
        return False
    return float32_bits(a) == float32_bits(b)


def _delta(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.inf
    d = abs(a - b)
    return d if not math.isnan(d) else math.inf  # inf - inf


def _margin(top: Sequence[Sequence[float]] | None, position: int) -> float | None:
    if top is None or position >= len(top) or len(top[position]) < 2:
        return None
    best, second = sorted(top[position], reverse=True)[:2]
    return float(best - second)


def _missing(index: int, recorded: Output | None, replayed: Output | None) -> ChoiceComparison:
    return ChoiceComparison(
        index=index,
        recorded_tokens=len(recorded.token_ids) if recorded else 0,
        replayed_tokens=len(replayed.token_ids) if replayed else 0,
        tokens_equal=False,
        first_divergence=0,
        logprobs_compared=0,
        logprobs_differing=0,
        first_logprob_difference=None,
        max_abs_logprob_delta=None,
        top2_margin_at_divergence=_margin(recorded.top_logprobs, 0) if recorded else None,
        verdict=DIVERGED,
    )


def compare_choice(
    index: int, recorded: Output, replayed: Output, cut: bool = False
) -> ChoiceComparison:
    """One choice; with ``cut`` (the recorded output stopped early) the replay's tokens past
    the recorded ones are not compared, so a longer replay is no divergence."""
    a, b = list(recorded.token_ids), list(replayed.token_ids)
    common = min(len(a), len(b))
    first = next((i for i in range(common) if a[i] != b[i]), None)
    if first is None and (len(a) > len(b) or (len(a) < len(b) and not cut)):
        first = common
    prefix = common if first is None else first
    compared = differing = 0
    first_lp: int | None = None
    worst: float | None = None
    if recorded.logprobs is not None and replayed.logprobs is not None:
        la, lb = recorded.logprobs, replayed.logprobs
        compared = min(prefix, len(la), len(lb))
        for i in range(compared):
            if not same_bits(la[i], lb[i]):
                differing += 1
                if first_lp is None:
                    first_lp = i
            d = _delta(la[i], lb[i])
            worst = d if worst is None else max(worst, d)
    tokens_equal = first is None
    if not tokens_equal:
        verdict = DIVERGED
    elif differing == 0 and compared == len(a):  # every recorded logprob, bit for bit
        verdict = BITWISE
    else:
        verdict = LOGPROBS_DRIFT
    return ChoiceComparison(
        index=index,
        recorded_tokens=len(a),
        replayed_tokens=len(b),
        tokens_equal=tokens_equal,
        first_divergence=first,
        logprobs_compared=compared,
        logprobs_differing=differing,
        first_logprob_difference=first_lp,
        max_abs_logprob_delta=worst,
        top2_margin_at_divergence=None if first is None else _margin(recorded.top_logprobs, first),
        verdict=verdict,
    )


def compare(recorded: Generation, replayed: Generation, cut: bool = False) -> Comparison:
    """Compare a replay with the record, choice by choice (matched by position). ``cut``: the
    record is ``aborted`` (the client or the engine left mid-answer), so each recorded choice
    is the start of an output: only that start is compared, and a choice the record never
    began is no divergence."""
    prompt_equal = list(recorded.prompt_token_ids) == list(replayed.prompt_token_ids)
    n = max(len(recorded.choices), len(replayed.choices))
    choices = []
    for i in range(n):
        rec = recorded.choices[i] if i < len(recorded.choices) else None
        rep = replayed.choices[i] if i < len(replayed.choices) else None
        if rec is None and rep is not None and cut:
            choices.append(compare_choice(i, Output(()), rep, cut))
        elif rec is None or rep is None:
            choices.append(_missing(i, rec, rep))
        else:
            choices.append(compare_choice(i, rec, rep, cut))
    if not prompt_equal:
        verdict = PROMPT_MISMATCH
    elif not choices:
        verdict = BITWISE
    else:
        verdict = max((c.verdict for c in choices), key=_RANK.__getitem__)
    return Comparison(
        verdict=verdict,
        prompt_equal=prompt_equal,
        prompt_tokens=(len(recorded.prompt_token_ids), len(replayed.prompt_token_ids)),
        choices=tuple(choices),
        choice_count=(len(recorded.choices), len(replayed.choices)),
    )
