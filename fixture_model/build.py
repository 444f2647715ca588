"""Write a complete model directory, atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from fixture_model import tokenizer as tok
from fixture_model.weights import ModelShape, seeded_tensors, write_safetensors

SIZES: dict[str, ModelShape] = {
    # About 92 MB: big enough that batch composition changes the logits on vLLM CPU.
    "small": ModelShape(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
    ),
    # Under 1 MB, for fast unit tests. head_dim stays 64: vLLM's CPU attention rejects 16.
    "tiny": ModelShape(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    ),
}
WEIGHTS_FILE = "model.safetensors"


def _config(shape: ModelShape, bos_id: int, eos_id: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "initializer_range": shape.initializer_range,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
    }


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build(target: Path, size: str = "small", seed: int = 0) -> Path:
    """Build the ``size`` fixture model from ``seed`` into ``target`` (created or replaced).

    Files are written into a sibling temporary directory that replaces ``target`` only when
    complete, so an interrupted build never leaves a half-written model behind.
    """
    if size not in SIZES:
        raise ValueError(f"unknown fixture size {size!r}; choose one of {', '.join(SIZES)}")
    shape = SIZES[size]
    target = target.resolve()
    if target.exists() and not target.is_dir():
        raise ValueError(f"{target} exists and is not a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tokenizer = tok.train(shape.vocab_size)
        bos_id, eos_id = tokenizer.token_to_id(tok.BOS), tokenizer.token_to_id(tok.EOS)
        tokenizer.save(str(staging / "tokenizer.json"))
        _write_json(
            staging / "tokenizer_config.json",
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": tok.BOS,
                "eos_token": tok.EOS,
                "add_bos_token": True,
                "clean_up_tokenization_spaces": False,
                "model_max_length": shape.max_position_embeddings,
            },
        )
        _write_json(
            staging / "special_tokens_map.json", {"bos_token": tok.BOS, "eos_token": tok.EOS}
        )
        (staging / "chat_template.jinja").write_text(tok.CHAT_TEMPLATE, encoding="utf-8")
        _write_json(staging / "config.json", _config(shape, bos_id, eos_id))
        _write_json(
            staging / "generation_config.json",
            {"_from_model_config": True, "bos_token_id": bos_id, "eos_token_id": eos_id},
        )
        write_safetensors(
            staging / WEIGHTS_FILE,
            list(seeded_tensors(shape, seed)),
            {"format": "pt", "fixture_size": size, "fixture_seed": str(seed)},
        )
        os.chmod(staging, 0o755)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
