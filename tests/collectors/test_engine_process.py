"""The collector's snapshot of an engine found by PID alone (as a sidecar sharing the engine's
PID namespace sees it): its flags, its --config file, its environment (VLLM_BATCH_INVARIANT=1
gives kernel), its chat template override and the GPUs its CUDA_VISIBLE_DEVICES leaves it,
read from a real process's /proc entries."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.snapshot import take_snapshot
from fixture_model import build
from ledger.audit.derive import chat_template
from tests.support.fake_nvml import FakeNvml, h200

# Stands in for `vllm serve`: the same command-line shape, alive until killed.
STAND_IN = "import sys, time; time.sleep(120)"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("model") / "tiny", size="tiny")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator:
    started: list[subprocess.Popen[bytes]] = []

    def run(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", STAND_IN, "serve", "/model", *args],
            env={"PATH": "/usr/bin:/bin", **env},
            cwd=tmp_path,
        )
        started.append(proc)
        time.sleep(0.2)  # its /proc entries hold the final argv and environment
        return proc

    yield run
    for proc in started:
        proc.kill()
        proc.wait()


def test_an_engine_found_by_pid_with_its_overrides(model: Path, tmp_path: Path, spawn) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    (tmp_path / "serve.yaml").write_text(
        "max-num-seqs: 4\nhf-overrides: {max_position_embeddings: 64}\n"
    )
    proc = spawn(
        ["--config", "serve.yaml", "--chat-template", str(template), "-O", "3"],
        {"VLLM_BATCH_INVARIANT": "1", "CUDA_VISIBLE_DEVICES": "1", "VLLM_API_KEY": "hidden"},
    )
    snap = take_snapshot(model, engine_pid=proc.pid, nvml=FakeNvml(devices=[h200(0), h200(1)]))
    engine = snap.body["engine"]
    assert engine["batch_invariance"] == "kernel"
    assert engine["env"] == {"VLLM_BATCH_INVARIANT": "1"}  # the key is dropped
    assert engine["max_num_seqs"] == 4 and engine["hf_overrides"] == {"max_position_embeddings": 64}
    assert engine["optimization_level"] == "3"
    digest = "sha256:" + hashlib.sha256(template.read_bytes()).hexdigest()
    assert snap.body["model"]["chat_template"] == {"source": "--chat-template", "digest": digest}
    assert chat_template(snap.body) == digest  # what chat cache keys are made under
    assert snap.identity["chat_template_path"] == str(template)
    assert snap.identity["engine"]["pid"] == proc.pid
    assert snap.identity["gpu"]["nvml_indexes"] == [1]
    assert snap.identity["gpu"]["gpu_uuids"] == [h200(1).uuid]
    # the runtime probe ran the engine's own interpreter
    assert snap.identity["engine_python"] == sys.executable


def test_without_the_overrides_the_model_directorys_template_counts(model: Path, spawn) -> None:
    proc = spawn([], {})
    snap = take_snapshot(model, engine_pid=proc.pid, nvml=FakeNvml(devices=2))
    assert snap.body["model"]["chat_template"]["source"] != "--chat-template"
    assert snap.body["engine"]["batch_invariance"] == "none"
    assert snap.body["engine"]["tokenizer"] == "default"
    assert snap.identity["gpu"]["nvml_indexes"] == [0, 1]  # CUDA_VISIBLE_DEVICES unset


def test_an_engine_that_cannot_be_read_gives_one_id_whatever_its_pid(model: Path) -> None:
    """The reason a process could not be read named its PID, and went into the body: the same
    environment had a new fingerprint ID on every engine restart. The body says why without
    the PID; the identity keeps the detail."""
    ids = set()
    for pid in (2**22 + 11, 2**22 + 12):
        snap = take_snapshot(model, engine_pid=pid, nvml=FakeNvml(devices=1))
        assert str(pid) not in json.dumps(snap.body)
        assert snap.body["engine"]["unknown"]["flags"] == "the engine process does not exist"
        assert snap.identity["engine_process_problem"] == f"process {pid} does not exist"
        ids.add(snap.fingerprint_id)
    assert len(ids) == 1
