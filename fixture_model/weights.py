"""Seeded Llama weights in bfloat16, written as a safetensors file.

The weights are drawn from a normal distribution (std ``initializer_range``) with NumPy's PCG64
generator, then rounded to bfloat16 (round to nearest, ties to even), so no deep-learning
framework is needed to build the model. The safetensors writer follows the format's
specification: an 8-byte little-endian header length, a JSON header padded with spaces to a
multiple of 8 bytes, then the tensors' bytes in header order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ModelShape:
    """The architecture hyper-parameters of one fixture size."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int = 512
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def tensor_shapes(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every weight, in Hugging Face Llama naming."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        kv = self.num_key_value_heads * d
        yield "model.embed_tokens.weight", (self.vocab_size, h)
        for n in range(self.num_hidden_layers):
            p = f"model.layers.{n}"
            yield f"{p}.input_layernorm.weight", (h,)
            yield f"{p}.self_attn.q_proj.weight", (self.num_attention_heads * d, h)
            yield f"{p}.self_attn.k_proj.weight", (kv, h)
            yield f"{p}.self_attn.v_proj.weight", (kv, h)
            yield f"{p}.self_attn.o_proj.weight", (h, self.num_attention_heads * d)
            yield f"{p}.post_attention_layernorm.weight", (h,)
            yield f"{p}.mlp.gate_proj.weight", (i, h)
            yield f"{p}.mlp.up_proj.weight", (i, h)
            yield f"{p}.mlp.down_proj.weight", (h, i)
        yield "model.norm.weight", (h,)
        yield "lm_head.weight", (self.vocab_size, h)


def to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest, ties to even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return ((bits + rounding) >> np.uint32(16)).astype("<u2")


def seeded_tensors(shape: ModelShape, seed: int) -> Iterator[tuple[str, tuple[int, ...], bytes]]:
    """(name, shape, little-endian bfloat16 bytes) for every weight, drawn from ``seed``."""
    rng = np.random.Generator(np.random.PCG64(seed))
    for name, dims in shape.tensor_shapes():
        if name.endswith("norm.weight"):
            values = np.ones(dims, dtype=np.float32)
        else:
            values = rng.standard_normal(dims, dtype=np.float32) * np.float32(
                shape.initializer_range
            )
        yield name, dims, to_bfloat16(values).tobytes()


def write_safetensors(
    path: Path, tensors: list[tuple[str, tuple[int, ...], bytes]], metadata: dict[str, str]
) -> None:
    """Write ``tensors`` (already bfloat16 bytes) to ``path`` and fsync it."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name, dims, data in tensors:
        header[name] = {
            "dtype": "BF16",
            "shape": list(dims),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":"), sort_keys=False).encode()
    encoded += b" " * (-len(encoded) % 8)
    with path.open("wb") as out:
        out.write(len(encoded).to_bytes(8, "little"))
        out.write(encoded)
        for _, _, data in tensors:
            out.write(data)
        out.flush()
        os.fsync(out.fileno())
