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


PASSWORDS = {
    "POSTGRES_PASSWORD": "superuser-secret",
    "LEDGER_OWNER_PASSWORD": "owner-secret",
    "LEDGER_APP_PASSWORD": "app-secret",
}


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    models = tmp_path_factory.mktemp("model")
    proc = compose_config({**PASSWORDS, "MODEL_DIR": str(models)})
    assert proc.returncode == 0, proc.stderr
    parsed: dict[str, Any] = yaml.safe_load(proc.stdout)
    return parsed


def test_required_settings_are_demanded(tmp_path: Path) -> None:
    proc = compose_config({})
    assert proc.returncode != 0
    assert "POSTGRES_PASSWORD" in proc.stderr
    for name in PASSWORDS:
        rest = {k: v for k, v in PASSWORDS.items() if k != name}
        proc = compose_config({**rest, "MODEL_DIR": str(tmp_path)})
        assert proc.returncode != 0 and name in proc.stderr, name


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
    assert ledger["environment"]["LEDGER_DATABASE_URL"].startswith("postgresql://ledger_app:")
    assert ledger["command"] == ["serve"]  # `ledger serve` runs migrations at start
    assert ledger["depends_on"]["ledger-setup"]["condition"] == "service_completed_successfully"
    assert "ledger db upgrade" in services["ledger-setup"]["command"][0]


POOLS = ("throughput", "strict")


def gpus_of(service: dict[str, Any]) -> list[str]:
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "count" not in device  # a count gives every container GPU 0
    return list(device["device_ids"])


def mounts_of(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read-only) per mount, from the long or the short syntax."""
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            out.append((v["source"], v["target"], bool(v.get("read_only"))))
        else:
            source, target, *mode = v.split(":")
            out.append((source, target, mode == ["ro"]))
    return out


def volumes_of(service: dict[str, Any]) -> dict[str, str]:
    """Named volumes a service mounts: source -> target."""
    return {src: dst for src, dst, _ in mounts_of(service) if not src.startswith("/")}


@pytest.mark.parametrize("pool", POOLS)
def test_each_pool_is_a_gpu_worker_with_a_collector_beside_it(
    config: dict[str, Any], pool: str
) -> None:
    services = config["services"]
    engine, collector = services[f"vllm-{pool}"], services[f"collector-{pool}"]
    pod = services[f"pod-{pool}"]
    # a pod: engine and collector share the network and processes of a container that holds
    # only those, so an engine that restarts comes back beside the same collector
    for member in (engine, collector):
        assert member["pid"] == f"service:pod-{pool}"
        assert member["network_mode"] == f"service:pod-{pool}"
        assert "ports" not in member
    assert any(p["target"] == 8100 for p in pod["ports"])  # the collector's port, nothing else
    assert len(pod["ports"]) == 1
    assert pod["init"] is True and pod["cap_drop"] == ["ALL"] and pod["user"] != "0:0"
    assert pod["entrypoint"] == ["sleep", "infinity"] and not pod.get("volumes")
    assert pod["image"] == engine["image"]  # a new ledger image does not restart the engine
    args = collector["command"]
    assert args[0] == "collect"
    assert args[args.index("--engine-url") + 1] == "http://127.0.0.1:8000"  # found by port
    assert args[args.index("--pool") + 1] == pool
    assert args[args.index("--advertise-url") + 1] == f"http://pod-{pool}:8100"
    assert collector["depends_on"][f"vllm-{pool}"]["condition"] == "service_healthy"
    # built on the engine's image, so the engine's interpreter and libraries are there
    assert collector["build"]["dockerfile"] == "Dockerfile.collector"
    assert collector["build"]["args"]["VLLM_IMAGE"] == engine["image"]
    assert collector["cap_add"] == ["SYS_PTRACE"] and collector["cap_drop"] == ["ALL"]
    # every response names the ledger fingerprint once the operator sets it
    flags = engine["command"]
    assert flags[flags.index("--fingerprint-mode") + 1] == "custom"
    assert flags[flags.index("--fingerprint-value") + 1] == "unset"


def test_the_fingerprint_value_comes_from_the_environment(tmp_path: Path) -> None:
    ids = {
        "THROUGHPUT_FINGERPRINT_ID": "sha256:" + "a" * 64,
        "STRICT_FINGERPRINT_ID": "sha256:" + "b" * 64,
    }
    proc = compose_config({**PASSWORDS, "MODEL_DIR": str(tmp_path), **ids})
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    for pool in POOLS:
        flags = services[f"vllm-{pool}"]["command"]
        assert (
            flags[flags.index("--fingerprint-value") + 1] == ids[f"{pool.upper()}_FINGERPRINT_ID"]
        )


def test_one_gpu_per_pool_and_the_collector_sees_its_engines(config: dict[str, Any]) -> None:
    services = config["services"]
    pinned = {pool: gpus_of(services[f"vllm-{pool}"]) for pool in POOLS}
    assert all(len(ids) == 1 for ids in pinned.values())
    assert len({ids[0] for ids in pinned.values()}) == len(POOLS)  # no two pools share a GPU
    for pool in POOLS:
        assert gpus_of(services[f"collector-{pool}"]) == pinned[pool]


def test_secrets_per_role(config: dict[str, Any]) -> None:
    """The log key and the admin token only where the ledger runs; one key and one token
    per collector, in a volume no other collector mounts."""
    services = config["services"]
    ledger_env = services["ledger"]["environment"]
    secrets_dir = ledger_env["LEDGER_LOG_KEY_FILE"].rsplit("/", 1)[0]
    assert volumes_of(services["ledger"])["ledger-secrets"] == secrets_dir
    holders = {name for name, svc in services.items() if "ledger-secrets" in volumes_of(svc)}
    assert holders == {"ledger", "ledger-setup", "collector-keys"}  # no collector, no engine
    assert all(ro for _, _, ro in mounts_of(services["collector-keys"]))
    own = {pool: f"collector-{pool}-secrets" for pool in POOLS}
    for pool in POOLS:
        collector = services[f"collector-{pool}"]
        mounted = volumes_of(collector)
        assert own[pool] in mounted
        assert not set(mounted) & (
            {"ledger-secrets", "ledger-data"} | set(own.values()) - {own[pool]}
        )
        assert all(ro for src, _, ro in mounts_of(collector) if src == own[pool])
        assert "LEDGER_LOG_KEY_FILE" not in (collector.get("environment") or {})
        args = collector["command"]
        assert args[args.index("--key") + 1].startswith(mounted[own[pool]] + "/")
        assert args[args.index("--token-file") + 1].startswith(mounted[own[pool]] + "/")
        assert not any(f"vllm-{p}" in str(services[f"vllm-{pool}"].get("volumes")) for p in POOLS)
    # the setup writes the collectors' root-owned mount points as root, then hands the
    # ledger's secrets to the ledger's user (who must own a production log key's directory)
    assert services["ledger-setup"]["user"] == "0:0"
    assert services["ledger"].get("user") in (None, "10001", "10001:10001")
    setup = services["ledger-setup"]["command"][0]
    assert setup.rstrip().endswith("chown -R 10001:10001 /secrets")
    assert (
        "--name collector-$$pool" in setup and "keys new collector --dir /collector-$$pool" in setup
    )
    assert "--scope admin" in setup and "records:write" in setup


@pytest.mark.parametrize(
    "name", ["ledger", "vllm-throughput", "vllm-strict", "collector-throughput", "collector-strict"]
)
def test_long_running_services_have_health_checks_with_start_periods(
    config: dict[str, Any], name: str
) -> None:
    check = config["services"][name]["healthcheck"]
    assert check["test"] and check.get("start_period")
    assert config["services"][name]["restart"] == "unless-stopped"


def test_images_hold_no_secrets_or_local_state() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    # at any depth (a pattern without **/ matches only at the context's root)
    for pattern in (".venv*", "**/*.pem", "**/*.token", "**/*.sqlite", "**/.env", ".git"):
        assert pattern in ignored
    assert {"ledger-data", ".fixtures"} <= set(ignored)
    for dockerfile in ("Dockerfile", "Dockerfile.collector"):
        text = (ROOT / dockerfile).read_text()
        assert "HEALTHCHECK" in text and "start-period" in text
        # what `pip install .` reads is copied in: the metadata names the license file
        assert "LICENSE" in next(line for line in text.splitlines() if "pyproject.toml" in line)


def test_only_the_strict_pool_runs_batch_invariant_kernels(config: dict[str, Any]) -> None:
    services = config["services"]
    assert services["vllm-strict"]["environment"]["VLLM_BATCH_INVARIANT"] == "1"
    assert "VLLM_BATCH_INVARIANT" not in (services["vllm-throughput"].get("environment") or {})


def test_the_ledger_serves_as_a_role_that_cannot_lift_the_triggers(config: dict[str, Any]) -> None:
    """Migrations run as the tables' owner; the server as ledger_app (deploy/postgres makes
    both on Postgres' first start); the superuser's password stays in the postgres service."""
    services = config["services"]
    setup_url = services["ledger-setup"]["environment"]["LEDGER_DATABASE_URL"]
    assert setup_url == "postgresql://ledger_owner:owner-secret@postgres:5432/ledger"
    assert services["ledger"]["environment"]["LEDGER_DATABASE_URL"] == (
        "postgresql://ledger_app:app-secret@postgres:5432/ledger"
    )
    postgres = services["postgres"]
    assert ("/docker-entrypoint-initdb.d", True) in [(t, ro) for _, t, ro in mounts_of(postgres)]
    assert "POSTGRES_USER" not in postgres["environment"]  # the image's superuser, postgres
    for name, service in services.items():
        text = str(service.get("environment"))
        if name != "postgres":
            assert "superuser-secret" not in text, name
        if name not in ("postgres", "ledger-setup"):
            assert "owner-secret" not in text, name


def test_each_service_has_what_it_needs_and_no_more(config: dict[str, Any]) -> None:
    services = config["services"]
    setup = services["ledger-setup"]["command"][0]
    # a collector posts records, fingerprints and heartbeats; it reads nothing back
    assert "--scope records:write --name collector-$$pool" in setup
    assert "records:read" not in setup
    for pool in POOLS:
        engine = services[f"vllm-{pool}"]
        assert "ipc" not in engine and engine["shm_size"]  # not the host's IPC namespace
        args = engine["command"]
        assert args[args.index("--host") + 1] == "127.0.0.1"  # reached only by its collector
    image = services["vllm-strict"]["image"]
    assert services["vllm-throughput"]["image"] == image
    for pool in POOLS:  # the collector is built on the image its engine runs
        assert services[f"collector-{pool}"]["build"]["args"]["VLLM_IMAGE"] == image
    for one_shot in ("ledger-setup", "collector-keys"):
        assert services[one_shot]["healthcheck"] == {"test": ["NONE"]}  # disable: true
