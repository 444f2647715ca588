"""What recording top-k alternatives' IDs adds to the collector, per response, in process.

For a request with top-k logprobs the collector asks vLLM for ``token_id:N`` strings, reads the
IDs into the record and renders the strings back for the client (``collectors.tokens``). This
times, on one core, the client view (rendering) and the accumulator (reading the alternatives)
for a completions response and a chat response of N tokens with top-k rows, on the fixture
model's tokenizer (byte-level BPE, 512 tokens), with token IDs drawn at random: from the whole
vocabulary (a quarter of it is byte pieces that need the U+FFFD repair, far more than text
has) and from the tokens that decode whole. Median of --runs.

    .venv/bin/python bench/render.py --tokens 256 --top-k 5 --runs 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from collectors.exchange import CHAT, COMPLETIONS, Accumulator, ClientView, plan
from collectors.tokens import TokenRenderer
from fixture_model.tokenizer import train


def completion(ids: list[list[int]]) -> dict[str, Any]:
    return {
        "choices": [
            {
                "index": 0,
                "token_ids": [row[0] for row in ids],
                "logprobs": {
                    "text_offset": list(range(len(ids))),
                    "tokens": [f"token_id:{row[0]}" for row in ids],
                    "token_logprobs": [-0.5] * len(ids),
                    "top_logprobs": [
                        {f"token_id:{t}": -0.5 - i for i, t in enumerate(row)} for row in ids
                    ],
                },
            }
        ]
    }


def chat(ids: list[list[int]]) -> dict[str, Any]:
    def entry(t: int, i: int) -> dict[str, Any]:
        return {"token": f"token_id:{t}", "logprob": -0.5 - i, "bytes": [116]}

    return {
        "choices": [
            {
                "index": 0,
                "token_ids": [row[0] for row in ids],
                "logprobs": {
                    "content": [
                        {
                            **entry(row[0], 0),
                            "top_logprobs": [entry(t, i) for i, t in enumerate(row)],
                        }
                        for row in ids
                    ]
                },
            }
        ]
    }


def time_one(endpoint: str, body: dict[str, Any], data: dict[str, Any], renderer: TokenRenderer):
    p = plan(endpoint, body, can_render=True)
    started = time.perf_counter()
    ClientView(p, renderer).shape(data)
    rendered = time.perf_counter()
    Accumulator(endpoint, top_k=p.top_k).feed(data)
    return rendered - started, time.perf_counter() - rendered


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    tokenizer = train(512)  # byte-level: no leading-space marker

    def renderer_factory() -> TokenRenderer:  # a renderer with empty caches
        return TokenRenderer(tokenizer, None)

    renderer = renderer_factory()
    whole = [t for t in range(512) if not renderer.decode([t]).endswith("\ufffd")]
    print(f"{args.tokens} tokens x top-{args.top_k}, median of {args.runs} (ms per response)")
    for label, pool in (("any token", list(range(512))), ("whole tokens", whole)):
        rng = random.Random(0)
        ids = [rng.sample(pool, args.top_k + 1) for _ in range(args.tokens)]
        run_cases(label, ids, args, renderer_factory)


def run_cases(
    label: str,
    ids: list[list[int]],
    args: argparse.Namespace,
    fresh: Callable[[], TokenRenderer],
) -> None:
    cases = {
        "completions": (
            COMPLETIONS,
            {"model": "m", "prompt": "x", "logprobs": args.top_k},
            completion(ids),
        ),
        "chat": (
            CHAT,
            {"model": "m", "messages": [], "logprobs": True, "top_logprobs": args.top_k},
            chat([row[: args.top_k] for row in ids]),
        ),
    }
    for name, (endpoint, body, data) in cases.items():
        # cold: empty caches each run (the first response after start-up, the slowest case);
        # warm: the same response again, its tokens' strings cached
        cold = [time_one(endpoint, body, data, fresh()) for _ in range(args.runs)]
        warmed = fresh()
        time_one(endpoint, body, data, warmed)
        warm = [time_one(endpoint, body, data, warmed) for _ in range(args.runs)]
        print(
            f"{label:13s} {name:12s} render: cold {ms(cold, 0):6.2f} warm {ms(warm, 0):6.2f}"
            f"   read the alternatives {ms(cold + warm, 1):6.2f}"
        )


def ms(runs: list[tuple[float, float]], which: int) -> float:
    return statistics.median(r[which] for r in runs) * 1000


if __name__ == "__main__":
    main()
