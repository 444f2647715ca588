"""Which tokenizers the collector renders tokens for, and the placeholder syntax."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models

from collectors.tokens import TokenRenderer, parse_placeholder
from fixture_model.tokenizer import train


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bpe")
    train(512).save(str(path / "tokenizer.json"))
    return path


def with_config(source: Path, target: Path, config: dict[str, object] | None) -> Path:
    target.mkdir()
    (target / "tokenizer.json").write_text((source / "tokenizer.json").read_text())
    if config is not None:
        (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


def test_placeholders() -> None:
    assert parse_placeholder("token_id:42") == 42
    for other in ("token_id:", "token_id:-1", "token_id:4x", "token_id:\u0661", "tok", None, 42):
        assert parse_placeholder(other) is None


def test_renderers_only_where_decode_is_not_post_processed(bpe_dir: Path, tmp_path: Path) -> None:
    assert TokenRenderer.from_model_dir(tmp_path) is None  # no tokenizer.json
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{")
    assert TokenRenderer.from_model_dir(tmp_path / "broken") is None
    assert TokenRenderer.from_model_dir(bpe_dir) is not None
    # transformers 5 skips the clean-up for BPE models, unless forced
    cleanup = {"clean_up_tokenization_spaces": True}
    assert TokenRenderer.from_model_dir(with_config(bpe_dir, tmp_path / "a", cleanup)) is not None
    forced = {
        **cleanup,
        "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": True,
    }
    assert TokenRenderer.from_model_dir(with_config(bpe_dir, tmp_path / "b", forced)) is None
    # another model type: rendered without the clean-up, not with it (no top-k IDs recorded)
    wordpiece = tmp_path / "wordpiece"
    wordpiece.mkdir()
    Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(
        str(wordpiece / "tokenizer.json")
    )
    assert TokenRenderer.from_model_dir(wordpiece) is not None
    assert TokenRenderer.from_model_dir(with_config(wordpiece, tmp_path / "c", cleanup)) is None
