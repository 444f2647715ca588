"""Our token rendering against vLLM's own functions, for every token of the fixture vocabulary.

vLLM's installed code (in the engine's environment) decodes every ID alone and repairs
U+FFFD pieces after contexts of preceding sampled tokens; ``TokenRenderer`` must give the same
strings, since the client sees them in place of vLLM's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from collectors.tokens import TokenRenderer
from tests.support.engine import engine_python

pytestmark = pytest.mark.engine

VLLM_SIDE = r"""
import json, sys
from vllm.tokenizers import get_tokenizer
from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens
from vllm.v1.engine.logprobs import LogprobsProcessor

tokenizer = get_tokenizer(sys.argv[1])
ask = json.load(sys.stdin)
processor = LogprobsProcessor(
    tokenizer=tokenizer, logprobs=[], prompt_logprobs=None, cumulative_logprob=0.0,
    num_logprobs=1, num_prompt_logprobs=None,
)
out = []
for context in ask["contexts"]:
    ids = ask["ids"]
    out.append(processor._verify_tokens(convert_ids_list_to_tokens(tokenizer, ids), ids, context))
json.dump(out, sys.stdout)
"""


def contexts_for(renderer: TokenRenderer, model_dir: Path) -> list[list[int]]:
    """No context, and the tokens of texts whose multi-byte characters split into pieces."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    texts = ["Grüße aus 東京 🙂", "naïve café ☕ 日本語", "🙂🙂 x", "ledger"]
    contexts: list[list[int]] = [[]]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        contexts.extend(ids[max(0, end - 4) : end] for end in range(1, len(ids) + 1))
    return contexts


def test_every_token_renders_as_vllm_renders_it(fixture_models: dict[str, Path]):
    model_dir = fixture_models["small"]
    renderer = TokenRenderer.from_model_dir(model_dir)
    assert renderer is not None
    vocab = json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    ids = sorted(vocab.values())
    contexts = contexts_for(renderer, model_dir)
    theirs = subprocess.run(
        [engine_python(), "-c", VLLM_SIDE, str(model_dir)],
        input=json.dumps({"ids": ids, "contexts": contexts}),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    expected = json.loads(theirs.stdout)
    for context, want in zip(contexts, expected, strict=True):
        got = [renderer.piece(token_id, context) for token_id in ids]
        assert got == want, f"context {context}"
    # The vocabulary has byte pieces that decode to U+FFFD alone, so the repair path ran, and
    # some contexts complete a character (a repaired piece that is not empty).
    pieces = [t for t in ids if renderer.decode([t]).endswith("\ufffd")]
    assert pieces
    completed = [renderer.piece(t, c) for c in contexts for t in pieces]
    assert any(text and not text.endswith("\ufffd") for text in completed)
