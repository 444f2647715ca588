"""Pool certification (the replay matrix): probe prompts, per-cell figures, the certificate.

Pure functions; the API runs the probes. For every ``max_tokens`` value the probes run alone,
one after another (the baseline), alone again (the ``concurrency 1`` row: serial
reproducibility), and then in waves of ``c`` concurrent requests of mixed lengths for every
other concurrency ``c``; every result is compared (``ledger.compare``) with its prompt's
baseline. A pool is ``invariant_observed`` only when every comparison was bitwise.

Certificate body (schema version 1, kind ``pool_certificate``, signed by the log key):

    {"schema_version", "certificate_id", "pool", "worker_id", "fingerprint_id",
     "batch_invariance", "parameters": {"prompts", "concurrency", "max_tokens", "seed",
     "prompt_chars"}, "results": [<cell>], "invariant_observed", "started_at"?, "issued_at"}
    cell: {"max_tokens", "concurrency", "requests", "exact_tokens", "bitwise",
           "exact_token_rate", "bitwise_rate", "first_divergences", "min_margin",
           "min_margin_at_divergence"}
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ledger.canonical import figure
from ledger.clock import utc_now
from ledger.compare import BITWISE, Comparison, Generation

SCHEMA_VERSION = 1
MAX_CONCURRENCY = 256  # a wave's size
MAX_TOKENS = 4096  # a probe's output length
# The longest probe prompt, in characters: near a pool's max_model_len up to this (a signed
# max_model_len is the collector's word, and a 1M-token context needs no megabyte probes to
# show batch variance).
MAX_PROMPT_CHARS = 65_536
# The most probes one certification sends: a job holds its pool (one runs per pool at a time)
# until it ends, so it is bounded (256 prompts at concurrency 1, 8, 32 and 128, two lengths).
MAX_PROBES = 8_192
_WORDS = [
    "ledger",
    "record",
    "replay",
    "token",
    "engine",
    "batch",
    "kernel",
    "model",
    "prompt",
    "output",
    "signed",
    "proof",
    "audit",
    "logit",
    "float",
    "seed",
    "cache",
    "pool",
    "worker",
    "tree",
    "root",
    "leaf",
    "check",
    "bit",
    "sample",
    "drift",
    "order",
    "merge",
    "scheduler",
    "prefill",
    "chunk",
    "prefix",
    "reduce",
    "sum",
    "matrix",
    "vector",
    "tensor",
    "layer",
    "head",
    "attention",
]


@dataclass(frozen=True)
class Probe:
    index: int
    kind: str  # short | medium | long
    text: str


def wave_size(prompts: int, c: int) -> int:
    """Probes at concurrency ``c``: every prompt at least once, in full waves of ``c``."""
    return -(-prompts // c) * c


def probe_count(parameters: dict[str, Any]) -> int:
    """The probes a certification with these (normalized) parameters sends: per ``max_tokens``
    value, the baseline and the ``concurrency 1`` row (each prompt once), and the waves."""
    prompts = parameters["prompts"]
    waves = sum(wave_size(prompts, c) for c in parameters["concurrency"] if c > 1)
    return int((2 * prompts + waves) * len(parameters["max_tokens"]))


def probe_prompts(count: int, seed: int, char_budget: int) -> list[Probe]:
    """``count`` prompts cycling short, medium and near-limit lengths, from ``seed``.

    ``char_budget`` bounds the longest prompt in characters: ASCII text never takes more
    tokens than characters in a byte-level or SentencePiece tokenizer (plus a BOS token).
    """
    rng = random.Random(seed)
    budgets = {"short": min(24, char_budget), "medium": min(160, char_budget)}
    budgets["long"] = max(char_budget, 1)
    probes = []
    for i in range(count):
        kind = ("short", "medium", "long")[i % 3]
        words: list[str] = []
        limit = budgets[kind] if kind == "long" else rng.randint(budgets[kind] // 2, budgets[kind])
        size = -1  # the length of " ".join(words), kept as the words are added
        while True:
            word = rng.choice(_WORDS)
            if size + 1 + len(word) > limit:
                break
            words.append(word)
            size += 1 + len(word)
        probes.append(Probe(i, kind, " ".join(words) or rng.choice(_WORDS)[: max(limit, 1)]))
    return probes


def probe_request(probe: Probe, max_tokens: int, model: str | None) -> dict[str, Any]:
    """A greedy completions request asking for what the comparison needs."""
    body: dict[str, Any] = {
        "prompt": probe.text,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 2,  # the sampled token's logprob and the top-2 margin
        "return_token_ids": True,
        "ignore_eos": True,  # full-length outputs: every position is compared
    }
    if model is not None:
        body["model"] = model
    return body


def _min(values: Sequence[float]) -> float | None:
    return figure(min(values)) if values else None


def cell(
    max_tokens: int,
    concurrency: int,
    comparisons: Sequence[Comparison],
    baselines: Sequence[Generation],
) -> dict[str, Any]:
    """Figures of one matrix cell; ``baselines`` supply the margins (closest calls)."""
    n = len(comparisons)
    exact = sum(c.prompt_equal and all(ch.tokens_equal for ch in c.choices) for c in comparisons)
    bitwise = sum(c.verdict == BITWISE for c in comparisons)
    firsts = sorted(c.first_divergence for c in comparisons if c.first_divergence is not None)
    at_divergence = [
        ch.top2_margin_at_divergence
        for c in comparisons
        for ch in c.choices
        if ch.top2_margin_at_divergence is not None
    ]
    margins = [
        row[0] - row[1]
        for g in baselines
        for out in g.choices
        for row in (out.top_logprobs or [])
        if len(row) >= 2
    ]
    return {
        "max_tokens": max_tokens,
        "concurrency": concurrency,
        "requests": n,
        "exact_tokens": exact,
        "bitwise": bitwise,
        "exact_token_rate": exact / n if n else 0.0,
        "bitwise_rate": bitwise / n if n else 0.0,
        "first_divergences": firsts,
        "min_margin": _min(margins),
        "min_margin_at_divergence": _min(at_divergence),
    }


def certificate(
    *,
    certificate_id: str,
    pool: str,
    worker_id: str,
    fingerprint_id: str,
    batch_invariance: str,
    parameters: dict[str, Any],
    results: list[dict[str, Any]],
    started_at: str | None = None,
) -> dict[str, Any]:
    """The certificate of a finished run; ``started_at``: when its job was created (RFC 3339),
    which a poll of the done job then answers from this signed body."""
    body = {
        "schema_version": SCHEMA_VERSION,
        "certificate_id": certificate_id,
        "pool": pool,
        "worker_id": worker_id,
        "fingerprint_id": fingerprint_id,
        "batch_invariance": batch_invariance,
        "parameters": parameters,
        "results": results,
        "invariant_observed": bool(results) and all(r["bitwise"] == r["requests"] for r in results),
        "issued_at": utc_now(),
    }
    if started_at is not None:
        body["started_at"] = started_at
    return body
