"""The fixture model: shapes, determinism, bfloat16 rounding, safetensors layout, tokenizer."""

from __future__ import annotations

import importlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from fixture_model import SIZES, build
from fixture_model.tokenizer import SPECIAL_TOKENS
from fixture_model.weights import to_bfloat16


def read_safetensors_header(path: Path) -> tuple[dict[str, dict], int]:
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return header, 8 + length


def test_bfloat16_rounds_to_nearest_even():
    values = np.array(
        [1.0, -2.0, 0.0, -0.0, 1.00390625, 1.01171875, 3.0e38, np.inf], dtype=np.float32
    )
    bits = to_bfloat16(values).tolist()
    # 1.00390625 is exactly halfway between 1.0 and 1.0078125: ties go to the even 1.0;
    # 1.01171875 is halfway between 1.0078125 (odd) and 1.015625: it goes up to the even one.
    assert bits == [0x3F80, 0xC000, 0x0000, 0x8000, 0x3F80, 0x3F82, 0x7F62, 0x7F80]


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_shapes_and_safetensors_layout(fixture_models: dict[str, Path], size: str):
    model = fixture_models[size]
    shape = SIZES[size]
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] == shape.hidden_size
    assert config["head_dim"] == shape.head_dim >= 64  # vLLM's CPU attention rejects 16
    assert config["torch_dtype"] == "bfloat16"
    header, data_start = read_safetensors_header(model / "model.safetensors")
    assert data_start % 8 == 0
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert len(tensors) == 3 + 9 * shape.num_hidden_layers
    offset = 0
    for name, spec in tensors.items():
        assert spec["dtype"] == "BF16", name
        assert spec["data_offsets"][0] == offset
        offset = spec["data_offsets"][1]
        assert offset - spec["data_offsets"][0] == 2 * int(np.prod(spec["shape"]))
    assert data_start + offset == (model / "model.safetensors").stat().st_size
    assert tensors["model.layers.0.self_attn.k_proj.weight"]["shape"] == [
        shape.num_key_value_heads * shape.head_dim,
        shape.hidden_size,
    ]
    total = sum(p.stat().st_size for p in model.iterdir())
    if size == "small":
        assert 90e6 < total < 95e6
    else:
        assert total < 1e6


def test_same_seed_same_bytes_other_seed_other_weights(
    fixture_models: dict[str, Path], tmp_path: Path
):
    again = build(tmp_path / "again", size="tiny")
    other = build(tmp_path / "other", size="tiny", seed=1)
    reference = fixture_models["tiny"]
    for path in reference.iterdir():
        assert (again / path.name).read_bytes() == path.read_bytes(), path.name
    assert (other / "model.safetensors").read_bytes() != (
        reference / "model.safetensors"
    ).read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (reference / "tokenizer.json").read_bytes()


def test_tokenizer_is_byte_level_bpe_of_about_512_tokens(fixture_models: dict[str, Path]):
    tokenizer = Tokenizer.from_file(str(fixture_models["tiny"] / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == 512
    for token in SPECIAL_TOKENS:
        assert tokenizer.token_to_id(token) is not None
    text = "Replay request 42: ünïcödé ✓ and bytes \x07 survive."
    encoding = tokenizer.encode(text)
    assert encoding.tokens[0] == "<s>"
    assert tokenizer.decode(encoding.ids, skip_special_tokens=True) == text
    # Merges were learned: common words are fewer tokens than bytes.
    assert len(tokenizer.encode("the model", add_special_tokens=False).ids) < len("the model")


def test_a_rebuild_replaces_the_directory_and_leaves_no_staging(tmp_path: Path):
    target = tmp_path / "m"
    target.mkdir()
    (target / "stale.bin").write_bytes(b"old")
    build(target, size="tiny")
    assert not (target / "stale.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    builder = importlib.import_module("fixture_model.build")

    def broken(*args: object, **kw: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(builder, "write_safetensors", broken)
    with pytest.raises(OSError):
        build(tmp_path / "m", size="tiny")
    assert list(tmp_path.iterdir()) == []


def test_unknown_size_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="unknown fixture size"):
        build(tmp_path / "m", size="huge")
