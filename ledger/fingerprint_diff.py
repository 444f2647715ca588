"""Field-by-field differences between two fingerprint bodies, each with its replay impact.

Pure: takes two bodies, returns :class:`Difference` values in body order. A difference is
``derived`` when it only follows from others (the manifest digest from the files, vLLM's own
``system_fingerprint`` from its config, ``batch_invariance`` from the scheduler flags), so a
reader can look at the causes first. A path joins member names with dots (``engine.env.X``);
a name other than letters, digits, ``_`` and ``-`` is written ``["as JSON"]``, so no member
a signer names can pass for another field (``["engine.batch_invariance"]``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ledger.fingerprint import RUNTIME_LIBRARIES

NOT_COMPARABLE = "outputs not comparable"
DERIVED = frozenset(
    {
        "model.digest",
        "model.weights_digest",
        "model.config_digest",
        "model.tokenizer_digest",
        "model.generation_config_digest",
        "model.chat_template.digest",
        "engine.system_fingerprint",
        "engine.batch_invariance",
    }
)
_LIBRARIES = frozenset(RUNTIME_LIBRARIES)
_SCHEDULER = frozenset(
    {
        "max_num_seqs",
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "max_num_batched_tokens",
        "async_scheduling",
        "scheduling_policy",
        "long_prefill_token_threshold",
    }
)
_NUMERICS = frozenset(
    {
        "dtype",
        "quantization",
        "quantization_config",
        "kv_cache_dtype",
        "speculative_config",
        "attention_config",
        "attention_backend",
        "model_impl",
        "moe_backend",
        "mamba_cache_dtype",
        "mamba_ssm_cache_dtype",
        "logits_processors",
    }
)
_PARALLEL = frozenset(
    {
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "decode_context_parallel_size",
        "prefill_context_parallel_size",
        "enable_expert_parallel",
        "disable_custom_all_reduce",
        "enable_batch_sharded_sampling",
    }
)
_COMPILATION = frozenset(
    {
        "compilation_config",
        "optimization_level",
        "cuda_graph_sizes",
        "max_seq_len_to_capture",
        "cudagraph_capture_sizes",
        "max_cudagraph_capture_size",
    }
)


@dataclass(frozen=True)
class Difference:
    path: str
    before: Any
    after: Any
    impact: str
    derived: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "before": self.before,
            "after": self.after,
            "impact": self.impact,
            "derived": self.derived,
        }


def _invariance_change(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    before, after = _at(a, "engine.batch_invariance"), _at(b, "engine.batch_invariance")
    if before == after:
        return None
    if after in (None, "none"):
        return "batch invariance lost"
    if before in (None, "none"):
        return f"batch invariance gained ({after})"
    return f"batch invariance mode {before} -> {after}"


def impact(path: str, a: dict[str, Any], b: dict[str, Any]) -> str:
    """What a change at ``path`` means for replaying A's records on B."""
    section, _, rest = path.partition(".")
    field = rest.split(".", 1)[0].split("[", 1)[0]
    whole = section != "schema_version" and section == path
    if whole and not (isinstance(_at(a, path), dict) and isinstance(_at(b, path), dict)):
        return f"the {section} section is missing or malformed on one side: not comparable"
    if section == "schema_version":
        return "different fingerprint schema: compare field by field with care"
    if section == "model":
        if field in ("weights_digest", "config_digest", "architectures", "model_type"):
            return f"model weights or architecture differ: {NOT_COMPARABLE}"
        if field == "tokenizer_digest":
            return "tokenizer differs: prompts may tokenize differently (prompt_mismatch)"
        if field == "chat_template":
            return "chat template differs: chat prompts may render differently (prompt_mismatch)"
        if field == "generation_config_digest":
            return "generation defaults differ: requests relying on defaults may sample differently"
        if field in ("files", "digest"):
            return "model files differ"
        return "model metadata differs"
    if section == "runtime":
        if field in _LIBRARIES:
            return f"{field} version changed: kernels may differ, bitwise reproduction not expected"
        if field in ("cpu_capability", "cpu_model", "machine"):
            return "CPU or its kernel dispatch changed: bitwise reproduction not expected"
        return "runtime changed: small risk to numerics"
    if section == "gpu":
        if field in ("driver_version", "cuda_driver_version"):
            return "GPU driver changed: kernels may differ, bitwise reproduction not expected"
        if field == "unknown":
            return "what could not be read differs"
        if path.startswith("gpu.gpus[") and (_at(a, path) is None) != (_at(b, path) is None):
            return (
                "read on one side only (unknown on the other, e.g. a collector of another "
                "version): not by itself a different GPU"
            )
        return "GPU model, count or mode changed: bitwise reproduction not expected"
    if section == "engine":
        lost = _invariance_change(a, b)
        if (
            field in _SCHEDULER
            or field == "batch_invariance"
            or path == "engine.env.VLLM_BATCH_INVARIANT"
        ):
            return lost or "scheduling changed: batched outputs may differ, invariance unchanged"
        if field in _NUMERICS:
            return f"numerics changed: {NOT_COMPARABLE}"
        if field in _COMPILATION or field == "enforce_eager":
            return (
                "compilation or CUDA graph capture changed: kernels may differ, "
                "bitwise reproduction not expected"
            )
        if field == "hf_overrides":
            return f"model configuration overridden differently: {NOT_COMPARABLE}"
        if field == "override_generation_config":
            return (
                "generation defaults overridden differently: requests relying on defaults may "
                "sample differently"
            )
        if field == "tokenizer":
            return "tokenizer override differs: prompts may tokenize differently (prompt_mismatch)"
        if field in _PARALLEL:
            return "parallelism changed: reduction order differs, bitwise reproduction not expected"
        if field in ("version", "system_fingerprint"):
            return "engine version or configuration changed"
        if field == "seed":
            return "default seed changed: sampled requests without their own seed differ"
        if field == "env":
            return "engine environment changed: may change kernels or scheduling"
        if field == "other_flags":
            return "a flag the collector does not interpret changed: may change outputs"
        if field == "unknown":
            return "what could not be read differs"
        return "engine setting changed: may change outputs"
    return "may change outputs"


def _at(body: dict[str, Any], path: str) -> Any:
    """The value at a ``_walk`` path such as ``gpu.gpus[0].name`` (None where there is none)."""
    value: Any = body
    for part in path.replace("[", ".[").split("."):
        index = part[1:-1]
        if part.startswith("[") and part.endswith("]") and index.isascii() and index.isdigit():
            i = int(index)  # "²" is a digit to str.isdigit, and no int
            value = value[i] if isinstance(value, list) and i < len(value) else None
        else:
            value = value.get(part) if isinstance(value, dict) else None
    return value


def _files_by_path(value: Any) -> dict[str, Any] | None:
    """A list of files by their path, when it is one: every entry an object whose ``path`` is
    a string, each path once (a signed body may hold anything: otherwise compared whole)."""
    if not isinstance(value, list) or not all(
        isinstance(v, dict) and isinstance(v.get("path"), str) for v in value
    ):
        return None
    files = {v["path"]: v for v in value}
    return files if len(files) == len(value) else None


def _same(x: Any, y: Any) -> bool:
    """Equal as the fingerprint ID sees them: ``true`` is not ``1`` (Python's ``==`` says it
    is), ``1.0`` is ``1`` (RFC 8785 writes both as ``1``)."""
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(v, y[k]) for k, v in x.items())
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(v, w) for v, w in zip(x, y, strict=True))
    if isinstance(x, bool) or isinstance(y, bool):
        return x is y
    if isinstance(x, int | float) and isinstance(y, int | float):
        return x == y
    return type(x) is type(y) and x == y


def _walk(path: str, x: Any, y: Any, out: list[tuple[str, Any, Any]]) -> None:
    if _same(x, y):
        return
    if isinstance(x, dict) and isinstance(y, dict):
        for key in list(x) + [k for k in y if k not in x]:
            _walk(member_path(path, key), x.get(key), y.get(key), out)
        return
    fx, fy = _files_by_path(x), _files_by_path(y)
    if fx is not None and fy is not None:
        for name in sorted(set(fx) | set(fy)):
            if not _same(fx.get(name), fy.get(name)):
                out.append((f"{path}[{name}]", fx.get(name), fy.get(name)))
        return
    if path == "gpu.gpus" and _same_count_of_devices(x, y):
        for i, (gx, gy) in enumerate(zip(x, y, strict=True)):
            _walk(f"{path}[{i}]", gx, gy, out)
        return
    out.append((path, x, y))


# A member name written bare in a path; any other is written as a JSON string in brackets, so
# that a signer's member named "engine.batch_invariance" is never read as that field.
_BARE = re.compile(r"[A-Za-z0-9_-]+")


def member_path(path: str, key: str) -> str:
    """``path`` extended by member ``key``: ``.key``, or ``["key"]`` when it is not plain."""
    if _BARE.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _same_count_of_devices(x: Any, y: Any) -> bool:
    return (
        isinstance(x, list)
        and isinstance(y, list)
        and len(x) == len(y)
        and all(isinstance(v, dict) for v in x + y)
    )


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    """Differences from fingerprint body ``a`` to ``b``; empty when they are the same."""
    found: list[tuple[str, Any, Any]] = []
    _walk("", a, b, found)
    return [
        Difference(path, before, after, impact(path, a, b), path in DERIVED)
        for path, before, after in found
    ]
