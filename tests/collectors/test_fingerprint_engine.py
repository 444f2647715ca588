"""Fingerprints of live vLLM CPU servers on the fixture model (marker ``engine``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from collectors.digest_cache import DigestCache
from collectors.runtime import FIELDS as RUNTIME_FIELDS
from collectors.snapshot import take_snapshot
from ledger.fingerprint_diff import diff
from tests.support.cli import ledger
from tests.support.engine import EngineServer
from tests.support.fake_nvml import FakeNvml
from tests.support.harness import Harness

pytestmark = pytest.mark.engine

ENGINE_FIELDS = {
    "name",
    "version",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_num_seqs",
    "max_model_len",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "speculative_config",
    "attention_backend",
    "seed",
    "env",
    "batch_invariance",
    "system_fingerprint",
    "unknown",
}


@pytest.fixture(scope="module")
def snapshots(engines: dict[str, EngineServer], tmp_path_factory: pytest.TempPathFactory):
    cache = DigestCache(tmp_path_factory.mktemp("cache") / "digests.sqlite")
    return {
        name: take_snapshot(server.model_dir, engine_url=server.url, cache=cache)
        for name, server in engines.items()
    }


def test_every_field_is_present(snapshots, engines):
    snap = snapshots["default"]
    body = snap.body
    assert set(body) == {"schema_version", "model", "runtime", "gpu", "engine"}
    assert body["model"]["weights_digest"].startswith("sha256:")
    assert body["model"]["chat_template"]["source"] == "chat_template.jinja"
    runtime = body["runtime"]
    assert set(runtime) == {*RUNTIME_FIELDS, "unknown"} and runtime["unknown"] == {}
    assert runtime["vllm"] == "0.32.0" and runtime["torch"].startswith("2.13.0")
    assert runtime["transformers"] and runtime["tokenizers"] and runtime["cpu_capability"]
    assert runtime["torch_cuda"] is None  # the CPU build
    assert body["gpu"]["gpus"] == [] and "NVML" in body["gpu"]["unknown"]["gpus"]
    engine = body["engine"]
    assert set(engine) >= ENGINE_FIELDS
    assert engine["version"] == "0.32.0"
    assert engine["system_fingerprint"].startswith("vllm-0.32.0-")
    assert engine["dtype"] == "bfloat16" and engine["max_model_len"] == 256
    assert engine["enable_prefix_caching"] is True and engine["max_num_seqs"] == "default"
    assert engine["batch_invariance"] == "none"
    assert engine["env"] == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert engine["unknown"] == {}
    # Identity is beside the body, never in it.
    assert snap.identity["engine"]["pid"] == engines["default"].pid
    assert snap.identity["engine_python"].endswith("/bin/python")
    assert str(engines["default"].port) not in json.dumps(body)


def test_the_strict_pool_is_serial(snapshots):
    engine = snapshots["strict"].body["engine"]
    assert engine["max_num_seqs"] == 1
    assert engine["enable_prefix_caching"] is False and engine["enable_chunked_prefill"] is False
    assert engine["batch_invariance"] == "serial"


def test_only_max_num_seqs_differs_and_diff_says_so(snapshots, tmp_path: Path):
    a, b = snapshots["default"], snapshots["seqs8"]
    assert a.fingerprint_id != b.fingerprint_id
    causes = [c for c in diff(a.body, b.body) if not c.derived]
    assert [(c.path, c.before, c.after) for c in causes] == [("engine.max_num_seqs", "default", 8)]
    files = []
    for name, snap in (("a", a), ("b", b)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"fingerprint_id": snap.fingerprint_id, "body": snap.body}))
        files.append(str(path))
    out = ledger("diff", *files, "--json", check=False)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert (report["a"], report["b"]) == (a.fingerprint_id, b.fingerprint_id)
    assert [d["path"] for d in report["differences"] if not d["derived"]] == ["engine.max_num_seqs"]
    table = ledger("diff", *files, check=False)
    assert table.returncode == 1 and "engine.max_num_seqs" in table.stdout
    same = ledger("diff", files[0], files[0])
    assert "identical" in same.stdout


def test_strict_to_default_loses_batch_invariance(snapshots):
    changes = {c.path: c for c in diff(snapshots["strict"].body, snapshots["default"].body)}
    assert changes["engine.max_num_seqs"].impact == "batch invariance lost"
    assert changes["engine.batch_invariance"].before == "serial"


def test_identical_workers_share_an_id(snapshots, engines):
    again = take_snapshot(engines["default"].model_dir, engine_url=engines["default"].url)
    assert again.fingerprint_id == snapshots["default"].fingerprint_id


def test_a_probe_with_another_vllm_than_the_engine_is_not_the_runtime(engines, tmp_path: Path):
    """The collector's interpreter is not the engine's when its image was built on another
    engine image: what it finds is not recorded as the engine's runtime."""
    other = tmp_path / "python"
    other.write_text('#!/bin/sh\necho \'{"vllm": "0.31.0", "torch": "2.8.0"}\'\n')
    other.chmod(0o755)
    server = engines["default"]
    snap = take_snapshot(server.model_dir, engine_url=server.url, engine_python=str(other))
    runtime = snap.body["runtime"]
    assert runtime["vllm"] is None and runtime["torch"] is None
    assert "answers vLLM 0.32.0" in runtime["unknown"]["runtime"]
    assert snap.body["engine"]["version"] == "0.32.0"


def test_gpu_section_with_nvml_values(engines):
    snap = take_snapshot(
        engines["strict"].model_dir, engine_url=engines["strict"].url, nvml=FakeNvml()
    )
    gpu = snap.body["gpu"]
    assert gpu["gpus"][0]["name"] == "NVIDIA H200" and gpu["driver_version"].startswith("580.")
    assert snap.identity["gpu"]["gpu_uuids"][0].startswith("GPU-")
    assert "GPU-" not in json.dumps(snap.body)


def test_cli_fingerprint_registers_with_the_ledger(engines, api: Harness, tmp_path: Path):
    key_file = tmp_path / "collector.pem"
    key = api.collector()
    key_file.write_bytes(key.private_pem())
    token_file = tmp_path / "token"
    token_file.write_text(api.token("records:write", "records:read"))
    server = engines["strict"]
    out = ledger(
        "fingerprint",
        "--model-dir",
        str(server.model_dir),
        "--engine-url",
        server.url,
        "--register",
        "--key",
        str(key_file),
        "--api",
        api.url,
        "--token-file",
        str(token_file),
        "--json",
        env={"LEDGER_DIGEST_CACHE": str(tmp_path / "d.sqlite")},
    )
    document = json.loads(out.stdout)
    assert document["registration"]["fingerprint_id"] == document["fingerprint_id"]
    assert document["registration"]["status"] in {"created", "duplicate"}
    stored = api.client().get(f"/v1/fingerprints/{document['fingerprint_id']}").json()
    assert stored["envelope"]["body"] == document["body"]
    # `ledger diff` takes IDs held by the ledger as well as files.
    same = ledger(
        "diff",
        document["fingerprint_id"],
        document["fingerprint_id"],
        "--api",
        api.url,
        "--token-file",
        str(token_file),
    )
    assert "identical" in same.stdout


def test_cli_table_shows_unknowns(engines, tmp_path: Path):
    server = engines["default"]
    out = ledger(
        "fingerprint",
        "--model-dir",
        str(server.model_dir),
        "--engine-url",
        server.url,
        env={"LEDGER_DIGEST_CACHE": str(tmp_path / "d.sqlite")},
    )
    assert "engine.batch_invariance" in out.stdout and "none" in out.stdout
    assert "unknown gpu.gpus" in out.stdout


def test_transformers_loads_the_fixture_model(engines):
    server = engines["default"]
    script = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "d = sys.argv[1]\n"
        "tok = AutoTokenizer.from_pretrained(d)\n"
        "model = AutoModelForCausalLM.from_pretrained(d)\n"
        "assert model.dtype == torch.bfloat16, model.dtype\n"
        "text = tok.apply_chat_template([{'role': 'user', 'content': 'Hi'}],"
        " tokenize=False, add_generation_prompt=True)\n"
        "assert text == '<s><|user|>\\nHi<|end|>\\n<|assistant|>\\n', repr(text)\n"
        "ids = tok('hello')['input_ids']\n"
        "out = model.generate(torch.tensor([ids]), max_new_tokens=2, do_sample=False)\n"
        "print(out.shape[1] - len(ids))\n"
    )
    done = subprocess.run(
        [server.python, "-c", script, str(server.model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "2"


def test_engine_pid_alone_reads_flags_and_the_engine_interpreter(engines):
    server = engines["strict"]
    snap = take_snapshot(server.model_dir, engine_pid=server.pid)
    engine = snap.body["engine"]
    assert engine["max_num_seqs"] == 1 and engine["batch_invariance"] == "serial"
    assert engine["version"] is None and "no engine URL" in engine["unknown"]["server"]
    assert snap.body["runtime"]["vllm"] == "0.32.0"
    assert snap.identity["engine"]["pid"] == server.pid
