"""Fingerprint differences and their replay impact."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ledger.fingerprint import fingerprint_id
from ledger.fingerprint_diff import diff


def body() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "model": {
            "digest": "sha256:aa",
            "files": [
                {"path": "config.json", "size": 10, "sha256": "c1"},
                {"path": "model.safetensors", "size": 99, "sha256": "w1"},
            ],
            "weights_digest": "sha256:w",
            "tokenizer_digest": "sha256:t",
            "chat_template": {"source": "chat_template.jinja", "digest": "sha256:j"},
        },
        "runtime": {"vllm": "0.32.0", "torch": "2.13.0+cpu", "python": "3.11.7"},
        "gpu": {"driver_version": "580.95.05", "gpus": [{"name": "NVIDIA H200"}]},
        "engine": {
            "max_num_seqs": 1,
            "enable_prefix_caching": False,
            "enable_chunked_prefill": False,
            "batch_invariance": "serial",
            "dtype": "bfloat16",
            "system_fingerprint": "vllm-0.32.0-aaaa",
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        },
    }


def test_identical_bodies_have_no_differences():
    assert diff(body(), body()) == []


def test_losing_serial_scheduling_says_batch_invariance_lost():
    a, b = body(), body()
    b["engine"].update(max_num_seqs=256, batch_invariance="none", system_fingerprint="vllm-x")
    changes = {c.path: c for c in diff(a, b)}
    assert set(changes) == {
        "engine.max_num_seqs",
        "engine.batch_invariance",
        "engine.system_fingerprint",
    }
    seqs = changes["engine.max_num_seqs"]
    assert (seqs.before, seqs.after, seqs.derived) == (1, 256, False)
    assert seqs.impact == "batch invariance lost"
    assert changes["engine.batch_invariance"].derived
    assert changes["engine.system_fingerprint"].derived
    back = {c.path: c for c in diff(b, a)}
    assert back["engine.max_num_seqs"].impact == "batch invariance gained (serial)"


def test_weights_tokenizer_and_template_each_have_their_own_impact():
    a, b = body(), body()
    b["model"]["files"][1]["sha256"] = "w2"
    b["model"]["weights_digest"] = "sha256:w2"
    b["model"]["digest"] = "sha256:bb"
    b["model"]["tokenizer_digest"] = "sha256:t2"
    b["model"]["chat_template"]["digest"] = "sha256:j2"
    changes = {c.path: c for c in diff(a, b)}
    assert changes["model.files[model.safetensors]"].after["sha256"] == "w2"
    assert "not comparable" in changes["model.weights_digest"].impact
    assert "prompt_mismatch" in changes["model.tokenizer_digest"].impact
    assert "chat template" in changes["model.chat_template.digest"].impact
    assert "model.files[config.json]" not in changes


def test_added_and_removed_files_and_fields():
    a, b = body(), body()
    b["model"]["files"].append({"path": "extra.bin", "size": 1, "sha256": "e"})
    del b["runtime"]["python"]
    b["engine"]["env"]["VLLM_BATCH_INVARIANT"] = "1"
    b["engine"]["batch_invariance"] = "kernel"
    changes = {c.path: c for c in diff(a, b)}
    assert changes["model.files[extra.bin]"].before is None
    assert changes["runtime.python"].after is None
    assert (
        changes["engine.env.VLLM_BATCH_INVARIANT"].impact
        == "batch invariance mode serial -> kernel"
    )


def test_library_driver_and_dtype_impacts():
    a = body()
    b = copy.deepcopy(a)
    b["runtime"]["torch"] = "2.14.1"
    b["gpu"]["driver_version"] = "590.1"
    b["engine"]["dtype"] = "float32"
    changes = {c.path: c.impact for c in diff(a, b)}
    assert changes["runtime.torch"].startswith("torch version changed")
    assert "driver" in changes["gpu.driver_version"]
    assert "not comparable" in changes["engine.dtype"]


def test_a_gpu_value_read_on_one_side_only_is_not_called_another_gpu():
    # A collector before whole GPUs' multiprocessors were counted, then one after.
    a, b = body(), body()
    a["gpu"]["gpus"][0]["multiprocessor_count"] = None
    a["gpu"]["unknown"] = {"gpus[0].multiprocessor_count": "nvmlDeviceGetAttributes: Not Supported"}
    b["gpu"]["gpus"][0]["multiprocessor_count"] = 132
    b["gpu"]["unknown"] = {}
    changes = {c.path: c for c in diff(a, b)}
    assert set(changes) == {
        "gpu.gpus[0].multiprocessor_count",
        'gpu.unknown["gpus[0].multiprocessor_count"]',
    }
    count = changes["gpu.gpus[0].multiprocessor_count"]
    assert (count.before, count.after) == (None, 132)
    assert count.impact.startswith("read on one side only")
    assert changes['gpu.unknown["gpus[0].multiprocessor_count"]'].impact == (
        "what could not be read differs"
    )


def test_another_gpu_model_is_named_per_device_and_another_count_as_a_whole():
    a, b = body(), body()
    b["gpu"]["gpus"][0]["name"] = "NVIDIA H100 80GB HBM3"
    (change,) = diff(a, b)
    assert change.path == "gpu.gpus[0].name"
    assert change.impact.startswith("GPU model, count or mode changed")
    b["gpu"]["gpus"] = [{"name": "NVIDIA H200"}, {"name": "NVIDIA H200"}]
    (change,) = diff(a, b)
    assert change.path == "gpu.gpus"
    assert change.impact.startswith("GPU model, count or mode changed")


def test_a_member_name_that_looks_like_a_path_is_quoted_never_read_as_that_field():
    a = {"schema_version": 1, "engine": {"batch_invariance": "none"}, "model": {"digest": "d"}}
    b = {**a, "engine.batch_invariance": "kernel", "model": {"digest": "d", "digest\u200b": "x"}}
    changes = {c.path: c for c in diff(a, b)}
    assert set(changes) == {'["engine.batch_invariance"]', 'model["digest\\u200b"]'}
    assert changes['["engine.batch_invariance"]'].impact == "may change outputs"
    assert "invariance" not in " ".join(c.impact for c in changes.values())


def test_values_the_id_tells_apart_are_never_called_identical() -> None:
    """``true`` and ``1`` give two fingerprint IDs; Python's ``==`` called them equal, so
    ``ledger diff`` printed "identical" for two different IDs."""
    a, b = body(), body()
    a["engine"]["enable_prefix_caching"] = False
    b["engine"]["enable_prefix_caching"] = 0
    a["engine"]["hf_overrides"] = {"flag": True}
    b["engine"]["hf_overrides"] = {"flag": 1}
    assert fingerprint_id(a) != fingerprint_id(b)
    assert {d.path for d in diff(a, b)} == {
        "engine.enable_prefix_caching",
        "engine.hf_overrides.flag",
    }
    # 1.0 and 1 are one number in RFC 8785, so one ID: no difference
    c, d = body(), body()
    c["engine"]["max_num_seqs"] = 1.0
    assert fingerprint_id(c) == fingerprint_id(d) and diff(c, d) == []


def test_a_section_missing_on_one_side_is_not_called_a_small_change() -> None:
    a, b = body(), body()
    del b["runtime"]
    (found,) = diff(a, b)
    assert found.path == "runtime" and "missing or malformed" in found.impact


@pytest.mark.parametrize("name", ["²", "٣", "0", "[1]", "a.b", "x]"])
def test_a_device_or_file_named_anything_is_diffed_not_an_error(name: str) -> None:
    """Names in a signed body are the signer's: one that str.isdigit calls a digit but int()
    refuses ("²", "٣") is a name like any other."""
    a = {"gpu": {"gpus": [{"path": name, "uuid": "GPU-a"}]}}
    b = {"gpu": {"gpus": [{"path": name + "'", "uuid": "GPU-a"}]}}
    found = diff(a, b)
    assert {d.path for d in found} == {f"gpu.gpus[{name}]", f"gpu.gpus[{name}']"}
    assert all(d.impact for d in found)
