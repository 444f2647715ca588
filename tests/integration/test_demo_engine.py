"""`make demo`'s command: real vLLM traffic through a collector into the embedded ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import ledger
from tests.support.engine import engine_python

pytestmark = pytest.mark.engine


def test_demo_sends_engine_traffic_through_a_collector(tmp_path: Path):
    python = engine_python()
    out = ledger(
        "demo",
        "--once",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path),
        "--engine-python",
        python,
        timeout=900,
    )
    for step in (
        "batch invariance",
        "completion (tier 2)",
        "logprob bits",
        "streamed chat recorded",
        "evidence verified offline",
        "all checks pass",
    ):
        assert step in out.stdout, out.stdout
    bundles = list(tmp_path.glob("evidence-req-*.json"))
    assert len(bundles) == 1
    bundle = json.loads(bundles[0].read_text())
    assert bundle["envelope"]["body"]["pool"] == "demo-strict"
    assert bundle["envelope"]["body"]["tier"] == 2
    verified = ledger("verify", str(bundles[0]), "--log-key", str(tmp_path / "log-key.pem"))
    assert verified.returncode == 0
    missing = ledger(
        "demo",
        "--once",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "x"),
        "--engine-python",
        str(tmp_path / "nope"),
        check=False,
    )
    assert missing.returncode == 1 and "make engine" in missing.stderr
