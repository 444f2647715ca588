"""`make demo`'s command: two real vLLM pools with collectors, traffic, replays, certification."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import ledger
from tests.support.engine import engine_python

pytestmark = pytest.mark.engine


def test_demo_records_replays_and_certifies_two_pools(tmp_path: Path):
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
        env={"COLUMNS": "400"},  # one table row per line, whatever the terminal
    )
    for step in (
        "batch invariance serial",
        "batch invariance none",
        "tier 2 on the throughput pool",
        "tier_refused",
        "logprob bits equal to the answer",
        "bitwise, every logprob bit",
        "no_matching_pool",
        "not_comparable",
        "engine.max_num_seqs",
        "cache lookup",
        "certify strict",
        "certify throughput",
        "replay verdicts: bitwise",
        "evidence verified offline",
        "all checks pass",
    ):
        assert step in out.stdout, out.stdout
    strict = next(line for line in out.stdout.splitlines() if "certify strict" in line)
    assert "NOT invariant" not in strict
    bundles = list(tmp_path.glob("evidence-req-*.json"))
    assert len(bundles) == 1
    bundle = json.loads(bundles[0].read_text())
    assert bundle["envelope"]["body"]["pool"] == "strict"
    verdicts = [r["envelope"]["body"]["verdict"] for r in bundle["replays"]]
    assert verdicts == ["bitwise", "not_comparable"]  # replayed, then forced onto throughput
    assert bundle["envelope"]["body"]["tier"] == 2
    # each pool's collector signs with its own key, registered for that pool only
    collector = bundle["keys"]["collector"]
    assert collector["name"] == "demo-collector-strict"
    assert collector["registration"]["envelope"]["body"]["pools"] == ["strict"]
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
    assert missing.returncode == 2 and "make engine" in missing.stderr
