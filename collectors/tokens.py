"""Token strings exactly as vLLM renders them in OpenAI logprobs.

To record the token IDs of the top-k alternatives, the collector asks vLLM for
``return_tokens_as_token_ids`` (every token string becomes ``token_id:N``) and then writes, for
the client, the strings vLLM would have sent. vLLM 0.32 builds them in
``vllm/v1/engine/logprobs.py`` and ``vllm/tokenizers/detokenizer_utils.py``:

- each ID is decoded alone with the Hugging Face tokenizer (special tokens kept);
- with a SentencePiece ``Metaspace`` pre-tokenizer, leading spaces the decode stripped are put
  back from the raw vocabulary piece;
- a string ending in U+FFFD (a byte-fallback piece of a multi-byte character) is decoded again
  after up to 4 preceding sampled tokens of the same output, and only the new text is kept
  (``""`` when the character is still incomplete).

:class:`TokenRenderer` does the same with the ``tokenizers`` library on the model directory's
``tokenizer.json``. It is used only where that is the whole story: a tokenizer whose decode
transformers does not post-process (``clean_up_tokenization_spaces`` off, or a BPE model, for
which transformers 5 ignores it). The integration tests compare the client's response through
the collector with vLLM's own, byte for byte, on prompts that split multi-byte characters.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer

PLACEHOLDER = "token_id:"
_FORCE_BPE_CLEANUP = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
REPLACEMENT = "\ufffd"
CONTEXT = 4  # preceding sampled tokens vLLM repairs with: enough for any UTF-8 sequence
REPAIRED_CACHE = 8192  # repaired pieces kept, by token and its context


def parse_placeholder(token: object) -> int | None:
    """N from vLLM's ``token_id:N``; None for anything else."""
    return _parse(token) if isinstance(token, str) else None


@lru_cache(maxsize=1 << 17)
def _parse(token: str) -> int | None:
    if not token.startswith(PLACEHOLDER):
        return None
    digits = token[len(PLACEHOLDER) :]
    return int(digits) if digits.isascii() and digits.isdigit() else None


class TokenRenderer:
    """Decodes single tokens, with vLLM's leading-space and U+FFFD repairs."""

    def __init__(self, tokenizer: Tokenizer, marker: str | None) -> None:
        self._tokenizer = tokenizer
        self._marker = marker
        self._piece = lru_cache(maxsize=65536)(self._decode_one)
        self._alone = lru_cache(maxsize=65536)(lambda token_id: self.decode([token_id]))
        # Keyed by the preceding tokens too, so varied text keeps adding entries (about 250
        # bytes each, tracemalloc under bench/soak.py): kept small, it is full within minutes
        # rather than taking the collector's memory up by about 16 MB over a long while.
        self._repaired = lru_cache(maxsize=REPAIRED_CACHE)(self._repair)

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> TokenRenderer | None:
        """A renderer for the model's tokenizer, or None where it cannot match vLLM exactly."""
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            return None
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
            config_path = model_dir / "tokenizer_config.json"
            config = (
                json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
            )
            tokenizer = Tokenizer.from_file(str(path))
        except Exception:  # OSError, ValueError, and tokenizers' own plain Exception
            return None
        if not isinstance(spec, dict) or not isinstance(config, dict):
            return None
        model_type = (spec.get("model") or {}).get("type")
        forced = config.get(_FORCE_BPE_CLEANUP)
        if config.get("clean_up_tokenization_spaces") and (model_type != "BPE" or forced):
            return None  # transformers would post-process every decode
        return cls(tokenizer, _leading_space_marker(spec))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def _decode_one(self, token_id: int) -> str:
        text = self.decode([token_id])
        if self._marker is None:
            return text
        raw = self._tokenizer.id_to_token(token_id) or ""
        markers = len(raw) - len(raw.lstrip(self._marker))
        missing = markers - (len(text) - len(text.lstrip(" ")))
        return " " * missing + text if missing > 0 else text

    def piece(self, token_id: int, context: Sequence[int]) -> str:
        """The string vLLM shows for ``token_id`` after the sampled tokens ``context``."""
        text = self._piece(token_id)
        if not text.endswith(REPLACEMENT):
            return text
        return self._repaired(token_id, tuple(context[-CONTEXT:]))

    def _repair(self, token_id: int, context: tuple[int, ...]) -> str:
        for size in range(1, len(context) + 1):
            window = context[-size:]
            full = self.decode([*window, token_id])
            if full.endswith(REPLACEMENT):
                continue
            # Context tokens that were themselves incomplete pieces showed as "": their bytes
            # belong to this token's text.
            clean_end = len(window)
            for j in range(len(window) - 1, -1, -1):
                if self._alone(window[j]).endswith(REPLACEMENT):
                    clean_end = j
                else:
                    break
            prefix = self.decode(list(window[:clean_end])) if clean_end > 0 else ""
            if full.startswith(prefix):
                return full[len(prefix) :]
            common = 0
            for a, b in zip(prefix, full, strict=False):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""


def _leading_space_marker(spec: dict[str, object]) -> str | None:
    pre = spec.get("pre_tokenizer")
    if not isinstance(pre, dict):
        return None
    candidates = [pre] if pre.get("type") != "Sequence" else pre.get("pretokenizers") or []
    for sub in candidates:
        if isinstance(sub, dict) and sub.get("type") == "Metaspace":
            replacement = sub.get("replacement", "\u2581")
            return replacement if isinstance(replacement, str) else "\u2581"
    return None
