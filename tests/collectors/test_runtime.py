"""The runtime probe runs with the engine's interpreter and says why a value is missing."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from pathlib import Path

from collectors.runtime import FIELDS, engines_own, snapshot_runtime


def test_the_probe_reports_the_interpreter_it_runs_in():
    snap = snapshot_runtime(sys.executable)
    body = snap.body
    assert set(body) == {*FIELDS, "unknown"}
    assert body["python"] == platform.python_version()
    assert body["tokenizers"] == metadata.version("tokenizers")
    assert body["vllm"] is None and body["torch"] is None  # not in the ledger's environment
    assert body["cpu_model"]
    assert snap.interpreter == sys.executable


def test_unknown_interpreter_is_explained():
    for python, reason in [
        (None, "interpreter is not known"),
        ("/nonexistent/python", "not found"),
        ("/bin/false", "probe failed (exit 1)"),
    ]:
        body = snapshot_runtime(python).body
        assert all(body[f] is None for f in FIELDS)
        assert reason in body["unknown"]["runtime"], python


def test_a_probe_that_hangs_is_stopped(tmp_path: Path):
    slow = tmp_path / "python"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    body = snapshot_runtime(str(slow), timeout=0.5).body
    assert "did not finish" in body["unknown"]["runtime"]


def test_a_probe_that_prints_garbage(tmp_path: Path):
    noisy = tmp_path / "python"
    noisy.write_text("#!/bin/sh\necho hello\n")
    noisy.chmod(0o755)
    assert snapshot_runtime(str(noisy)).body["unknown"]["runtime"] == (
        "the runtime probe printed no JSON"
    )


def test_an_interpreter_with_another_vllm_than_the_engine_describes_nothing(tmp_path: Path):
    """A collector image built on another engine image than the engine's runs the probe with
    its own vLLM and torch: the runtime section would name versions the engine does not run."""
    other = tmp_path / "python"
    other.write_text('#!/bin/sh\necho \'{"vllm": "0.31.0", "torch": "2.8.0"}\'\n')
    other.chmod(0o755)
    snap = snapshot_runtime(str(other))
    assert snap.body["vllm"] == "0.31.0"
    assert engines_own(snap, "0.31.0") is snap  # the engine's own: kept
    assert engines_own(snap, None) is snap  # the engine's version not known: nothing to compare
    assert engines_own(snap, "dev") is snap  # vLLM answers "dev" when it has no version file
    labelled = snapshot_runtime(str(other))
    labelled.body["vllm"] = "0.31.0+cu126"  # the package's build label, not in /version
    assert engines_own(labelled, "0.31.0") is labelled
    assert engines_own(labelled, "0.32.0").body["vllm"] is None
    stale = engines_own(snap, "0.32.0")
    assert all(stale.body[f] is None for f in FIELDS)
    reason = stale.body["unknown"]["runtime"]
    assert "vLLM 0.31.0" in reason and "vLLM 0.32.0" in reason and str(other) in reason
    assert stale.interpreter == str(other)
