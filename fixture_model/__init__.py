"""A small Llama-family model that real vLLM and transformers load, built from a seed.

Tests and the demo need a real engine serving a real model, with no download: ``build`` writes
seeded bfloat16 weights (safetensors), a byte-level BPE tokenizer trained on the text shipped
here, a chat template and ``generation_config.json``. The same seed and library versions give
the same bytes.
"""

from fixture_model.build import SIZES, ModelShape, build

__all__ = ["SIZES", "ModelShape", "build"]
