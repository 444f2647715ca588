"""`make gpu-check` in its CPU mode (small sizes): the whole loop on two real vLLM CPU pools,
measured, in one report; and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import ledger
from tests.support.engine import engine_python

pytestmark = pytest.mark.engine


def test_gpu_check_cpu_mode_reports_the_loop(tmp_path: Path):
    report_path = tmp_path / "report.json"
    out = ledger(
        "gpu-check",
        "--device",
        "cpu",
        "--requests",
        "16",
        "--concurrency",
        "4",
        "--certify-concurrency",
        "1,2",
        "--certify-prompts",
        "2",
        "--throughput-sample",
        "2",
        "--pairs",
        "3",
        "--out",
        str(report_path),
        "--data-dir",
        str(tmp_path / "data"),
        "--engine-python",
        engine_python(),
        timeout=900,
        env={"COLUMNS": "300"},
        check=False,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["device"] == "cpu" and report["passed"] is True
    assert report["traffic"]["recorded"] == 16 and report["traffic"]["requests_per_s"] > 0
    strict = report["replays"]["strict"]
    assert strict["replayed"] >= 4 and strict["bitwise_rate"] == 1.0
    assert strict["verdicts"] == {"bitwise": strict["replayed"]}
    sample = report["replays"]["throughput"]
    assert sample["replayed"] == 2 and sum(sample["observed"].values()) == 2
    assert strict["observed"] == strict["verdicts"]
    assert report["certification"]["strict"]["invariant"] is True
    assert [c["concurrency"] for c in report["certification"]["strict"]["cells"]] == [1, 2]
    for pool, facts in report["pools"].items():
        assert facts["batch_invariance"] == ("serial" if pool == "strict" else "none")
        assert facts["overhead"]["pairs"] == 3 and facts["overhead"]["throughput_ratio"] > 0
        assert facts["gpu"]["gpus"] == [] and facts["gpu"]["every_field_filled"] is False
        assert facts["runtime"]["vllm"] == "0.32.0"
    for step in ("engines and collectors", "traffic", "replays", "certification"):
        assert report["timings"][step] > 0
    assert "passed" in out.stdout and "replay strict" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "tpu"], "'tpu' is not one of 'auto', 'cuda', 'cpu'"),
        (["--certify-concurrency", "1,x"], "must be integers"),
        (["--certify-concurrency", "0"], "at least 1"),
        (["--engine-python", "/nonexistent/python"], "does not exist"),
    ],
)
def test_gpu_check_refuses_bad_options(tmp_path: Path, args: list[str], message: str):
    out = ledger(
        "gpu-check",
        "--data-dir",
        str(tmp_path),
        "--out",
        str(tmp_path / "r.json"),
        *args,
        check=False,
    )
    assert out.returncode != 0
    shown = " ".join((out.stdout + out.stderr).replace("│", " ").split())  # a usage box wraps
    assert message in shown
    assert not (tmp_path / "r.json").exists()
