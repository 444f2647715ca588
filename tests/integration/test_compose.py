"""docker-compose.yml validates against the Compose specification (Debian's docker-compose runs
``config`` with no Docker engine) and wires what the deployment promises."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.compose
ROOT = Path(__file__).resolve().parents[2]


def compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose is not installed (make test installs Debian's package)")
        pytest.skip("docker-compose is not installed")
    return subprocess.run(
        [binary, "-f", str(ROOT / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **env},
    )


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    models = tmp_path_factory.mktemp("model")
    proc = compose_config({"POSTGRES_PASSWORD": "secret", "MODEL_DIR": str(models)})
    assert proc.returncode == 0, proc.stderr
    parsed: dict[str, Any] = yaml.safe_load(proc.stdout)
    return parsed


def test_required_settings_are_demanded() -> None:
    proc = compose_config({})
    assert proc.returncode != 0
    assert "POSTGRES_PASSWORD" in proc.stderr


def test_services(config: dict[str, Any]) -> None:
    services = config["services"]
    assert {
        "postgres",
        "ledger",
        "vllm-throughput",
        "collector-throughput",
        "vllm-strict",
        "collector-strict",
    } <= set(services)
    ledger = services["ledger"]
    assert ledger["environment"]["LEDGER_ENVIRONMENT"] == "production"
    assert ledger["environment"]["LEDGER_DATABASE_URL"].startswith("postgresql://ledger:secret@")
    assert ledger["command"] == ["serve"]  # `ledger serve` runs migrations at start
    assert ledger["depends_on"]["ledger-setup"]["condition"] == "service_completed_successfully"
    assert "ledger db upgrade" in services["ledger-setup"]["command"][0]


@pytest.mark.parametrize("pool", ["throughput", "strict"])
def test_each_pool_is_a_gpu_worker_with_a_collector_beside_it(
    config: dict[str, Any], pool: str
) -> None:
    services = config["services"]
    engine, collector = services[f"vllm-{pool}"], services[f"collector-{pool}"]
    for svc in (engine, collector):
        (device,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert collector["pid"] == f"service:vllm-{pool}"
    args = collector["command"]
    assert args[0] == "collect"
    assert args[args.index("--engine-url") + 1] == f"http://vllm-{pool}:8000"
    assert args[args.index("--pool") + 1] == pool
    assert args[args.index("--advertise-url") + 1] == f"http://collector-{pool}:8100"
    assert collector["depends_on"][f"vllm-{pool}"]["condition"] == "service_healthy"


def test_only_the_strict_pool_runs_batch_invariant_kernels(config: dict[str, Any]) -> None:
    services = config["services"]
    assert services["vllm-strict"]["environment"]["VLLM_BATCH_INVARIANT"] == "1"
    assert "VLLM_BATCH_INVARIANT" not in (services["vllm-throughput"].get("environment") or {})
