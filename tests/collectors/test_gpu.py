"""The GPU part of the environment fingerprint, against a fake NVML and the real pynvml."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest

from collectors.gpu import GpuSnapshot, snapshot_gpus
from ledger.canonical import canonicalize
from tests.support.fake_nvml import H200_UUID, FakeGpu, FakeNvml, h200

H200_ENTRY = {
    "index": 0,
    "name": "NVIDIA H200",
    "compute_capability": "9.0",
    "memory_total_mib": 143771,
    "mig_mode": "disabled",
    "ecc_mode": "enabled",
    "multiprocessor_count": 132,
}
NO_GPUS_REASON = "NVML library not found: no NVIDIA driver on this host"


def assert_balanced(fake: FakeNvml) -> None:
    """nvmlInit came first, nvmlShutdown last, and NVML is left uninitialised."""
    assert fake.calls[0] == "nvmlInit"
    assert fake.calls[-1] == "nvmlShutdown"
    assert fake.calls.count("nvmlShutdown") == 1
    assert fake.initialized == 0


def test_h200_snapshot() -> None:
    fake = FakeNvml()
    snap = snapshot_gpus(fake)
    assert snap == GpuSnapshot(
        body={
            "driver_version": "580.95.05",
            "cuda_driver_version": "13.0",
            "gpus": [H200_ENTRY],
            "unknown": {},
        },
        identity={
            "gpu_uuids": [H200_UUID],
            "pci_bus_ids": ["00000000:19:00.0"],
            "nvml_indexes": [0],
            "visible_devices": None,
            "unknown": {},
        },
    )
    assert list(snap.body) == ["driver_version", "cuda_driver_version", "gpus", "unknown"]
    assert list(snap.body["gpus"][0]) == list(H200_ENTRY)
    assert_balanced(fake)


def test_two_devices() -> None:
    snap = snapshot_gpus(FakeNvml(devices=2))
    assert snap.body["gpus"] == [H200_ENTRY, {**H200_ENTRY, "index": 1}]
    uuids = snap.identity["gpu_uuids"]
    assert uuids[0] == H200_UUID
    assert len(set(uuids)) == 2
    assert snap.identity["pci_bus_ids"] == ["00000000:19:00.0", "00000000:3B:00.0"]


def test_two_hosts_with_the_same_cards_share_a_body() -> None:
    one = snapshot_gpus(FakeNvml(devices=[h200(0)]))
    other = snapshot_gpus(FakeNvml(devices=[h200(5)]))
    assert canonicalize(one.body) == canonicalize(other.body)
    assert one.identity != other.identity


def test_body_holds_no_uuid_or_bus_id() -> None:
    snap = snapshot_gpus(FakeNvml(devices=8))
    text = canonicalize(snap.body).decode()
    assert "GPU-" not in text
    for value in snap.identity["gpu_uuids"] + snap.identity["pci_bus_ids"]:
        assert value not in text
    assert "uuid" not in text.lower()
    assert "bus" not in text.lower()


def test_no_nvml_library_gives_no_gpus_and_a_reason() -> None:
    fake = FakeNvml(missing_library=True)
    snap = snapshot_gpus(fake)
    assert snap.body == {
        "driver_version": None,
        "cuda_driver_version": None,
        "gpus": [],
        "unknown": {"gpus": NO_GPUS_REASON},
    }
    assert snap.identity == {
        "gpu_uuids": [],
        "pci_bus_ids": [],
        "nvml_indexes": [],
        "visible_devices": None,
        "unknown": {},
    }
    # Nothing after the failed init: no queries, and no nvmlShutdown of an NVML never started.
    assert fake.calls == ["nvmlInit"]


def test_driver_not_loaded_has_its_own_reason() -> None:
    snap = snapshot_gpus(FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert snap.body["gpus"] == []
    assert snap.body["unknown"] == {"gpus": "NVIDIA kernel driver not loaded"}


def test_other_init_errors_quote_nvml() -> None:
    snap = snapshot_gpus(FakeNvml(init_error=pynvml.NVML_ERROR_UNKNOWN))
    assert snap.body["unknown"] == {"gpus": "nvmlInit: Unknown Error"}


def test_pynvml_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    snap = snapshot_gpus()
    assert snap.body["gpus"] == []
    assert snap.body["driver_version"] is None
    assert snap.body["unknown"]["gpus"].startswith("nvidia-ml-py (pynvml) cannot be imported")


def test_not_supported_ecc_and_core_count_are_none_with_a_reason() -> None:
    fake = FakeNvml(not_supported={"nvmlDeviceGetEccMode", "nvmlDeviceGetNumGpuCores"})
    snap = snapshot_gpus(fake)
    assert snap.body["gpus"] == [{**H200_ENTRY, "ecc_mode": None, "multiprocessor_count": None}]
    assert snap.body["unknown"] == {
        "gpus[0].ecc_mode": "nvmlDeviceGetEccMode: Not Supported",
        "gpus[0].multiprocessor_count": "nvmlDeviceGetNumGpuCores: Not Supported",
    }
    assert snap.identity["gpu_uuids"] == [H200_UUID]
    assert_balanced(fake)


def test_one_device_under_mig() -> None:
    """CUDA runs on a MIG instance, never on a MIG-enabled GPU as a whole: with no instance
    named (CUDA_VISIBLE_DEVICES unset, or an ordinal), the whole GPU's size described a 1g
    slice and a 7g one alike. Its memory and multiprocessors are then unknown, said so."""
    enabled = (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE)
    mig = h200(1, mig_mode=enabled, not_supported=frozenset({"nvmlDeviceGetNumGpuCores"}))
    snap = snapshot_gpus(FakeNvml(devices=[h200(0), mig]))
    assert snap.body["gpus"] == [
        H200_ENTRY,
        {
            **H200_ENTRY,
            "index": 1,
            "mig_mode": "enabled",
            "memory_total_mib": None,
            "multiprocessor_count": None,
            "mig_instance": None,
        },
    ]
    assert list(snap.body["unknown"]) == ["gpus[1].mig_instance"]
    assert "names no MIG instance" in snap.body["unknown"]["gpus[1].mig_instance"]


def test_consumer_card_without_ecc_or_mig() -> None:
    card = FakeGpu(
        name="NVIDIA GeForce RTX 4090",
        compute_capability=(8, 9),
        memory_total=24564 * 2**20,
        cuda_cores=128 * 128,
        not_supported=frozenset({"nvmlDeviceGetEccMode", "nvmlDeviceGetMigMode"}),
    )
    snap = snapshot_gpus(FakeNvml(devices=[card], cuda_driver_version=12080))
    assert snap.body["cuda_driver_version"] == "12.8"
    assert snap.body["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA GeForce RTX 4090",
            "compute_capability": "8.9",
            "memory_total_mib": 24564,
            "mig_mode": None,
            "ecc_mode": None,
            "multiprocessor_count": 128,
        }
    ]
    assert sorted(snap.body["unknown"]) == ["gpus[0].ecc_mode", "gpus[0].mig_mode"]


def test_a_whole_gpu_counts_multiprocessors_from_its_cores_not_its_attributes() -> None:
    # A real H200 (driver 580.159.04) answers nvmlDeviceGetAttributes for MIG instances only.
    fake = FakeNvml()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlInit()
        try:
            fake.nvmlDeviceGetAttributes(fake.nvmlDeviceGetHandleByIndex(0))
        finally:
            fake.nvmlShutdown()
    snap = snapshot_gpus(fake)
    assert snap.body["gpus"][0]["multiprocessor_count"] == 132
    assert snap.body["unknown"] == {}
    assert "nvmlDeviceGetNumGpuCores" in fake.calls


@pytest.mark.parametrize(
    ("capability", "cores", "count"),
    [
        ((8, 0), 108 * 64, 108),
        ((8, 6), 84 * 128, 84),
        ((7, 5), 40 * 64, 40),
        ((10, 0), 148 * 128, 148),
    ],
)
def test_cores_per_multiprocessor_follow_the_compute_capability(
    capability: tuple[int, int], cores: int, count: int
) -> None:
    card = FakeGpu(compute_capability=capability, cuda_cores=cores)
    assert snapshot_gpus(FakeNvml(devices=[card])).body["gpus"][0]["multiprocessor_count"] == count


def test_a_compute_capability_without_a_known_core_count_is_unknown_not_guessed() -> None:
    snap = snapshot_gpus(FakeNvml(devices=[FakeGpu(compute_capability=(13, 0))]))
    assert snap.body["gpus"][0]["multiprocessor_count"] is None
    assert snap.body["unknown"] == {
        "gpus[0].multiprocessor_count": (
            "no CUDA cores per multiprocessor known for compute capability 13.0"
        )
    }


def test_cores_that_are_no_whole_number_of_multiprocessors_are_unknown() -> None:
    snap = snapshot_gpus(FakeNvml(devices=[FakeGpu(cuda_cores=132 * 128 + 64)]))
    assert snap.body["gpus"][0]["multiprocessor_count"] is None
    assert (
        "not a whole number of 128-core multiprocessors"
        in (snap.body["unknown"]["gpus[0].multiprocessor_count"])
    )


def test_an_unknown_compute_capability_leaves_the_multiprocessors_unknown() -> None:
    fake = FakeNvml(not_supported={"nvmlDeviceGetCudaComputeCapability"})
    snap = snapshot_gpus(fake)
    assert snap.body["gpus"][0]["multiprocessor_count"] is None
    assert snap.body["unknown"]["gpus[0].multiprocessor_count"] == (
        "the compute capability is unknown"
    )
    assert "nvmlDeviceGetNumGpuCores" not in fake.calls


def test_system_queries_that_fail_are_none_with_a_reason() -> None:
    fake = FakeNvml(
        errors={
            "nvmlSystemGetDriverVersion": pynvml.NVML_ERROR_UNKNOWN,
            "nvmlSystemGetCudaDriverVersion": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        }
    )
    snap = snapshot_gpus(fake)
    assert snap.body["driver_version"] is None
    assert snap.body["cuda_driver_version"] is None
    assert snap.body["gpus"] == [H200_ENTRY]
    assert snap.body["unknown"] == {
        "cuda_driver_version": "nvmlSystemGetCudaDriverVersion: Function Not Found",
        "driver_version": "nvmlSystemGetDriverVersion: Unknown Error",
    }
    assert list(snap.body["unknown"]) == sorted(snap.body["unknown"])


def test_device_count_failure() -> None:
    fake = FakeNvml(errors={"nvmlDeviceGetCount": pynvml.NVML_ERROR_UNKNOWN})
    snap = snapshot_gpus(fake)
    assert snap.body["driver_version"] == "580.95.05"
    assert snap.body["gpus"] == []
    assert snap.body["unknown"] == {"gpus": "nvmlDeviceGetCount: Unknown Error"}
    assert_balanced(fake)


def test_lost_device_keeps_its_place_with_no_values() -> None:
    fake = FakeNvml(errors={"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_GPU_IS_LOST})
    snap = snapshot_gpus(fake)
    assert snap.body["gpus"] == [{key: None for key in H200_ENTRY} | {"index": 0}]
    assert snap.body["unknown"] == {"gpus[0]": "nvmlDeviceGetHandleByIndex: GPU is lost"}
    assert snap.identity["gpu_uuids"] == [None]
    assert_balanced(fake)


def test_identity_failures_stay_out_of_the_body() -> None:
    fake = FakeNvml(not_supported={"nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo"})
    snap = snapshot_gpus(fake)
    assert snap.body["gpus"] == [H200_ENTRY]
    assert snap.body["unknown"] == {}
    assert snap.identity == {
        "gpu_uuids": [None],
        "pci_bus_ids": [None],
        "nvml_indexes": [0],
        "visible_devices": None,
        "unknown": {
            "gpu_uuids[0]": "nvmlDeviceGetUUID: Not Supported",
            "pci_bus_ids[0]": "nvmlDeviceGetPciInfo: Not Supported",
        },
    }


def test_shutdown_follows_init_even_when_queries_fail() -> None:
    fake = FakeNvml(
        devices=2,
        not_supported={"nvmlDeviceGetEccMode", "nvmlDeviceGetName"},
        errors={"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_GPU_IS_LOST},
    )
    snapshot_gpus(fake)
    assert_balanced(fake)


class _Broken(FakeNvml):
    def nvmlDeviceGetName(self, handle: Any) -> str:
        self.calls.append("nvmlDeviceGetName")
        raise RuntimeError("a bug, not an NVML answer")


def test_shutdown_follows_init_when_a_bug_escapes() -> None:
    fake = _Broken()
    with pytest.raises(RuntimeError, match="a bug"):
        snapshot_gpus(fake)
    assert_balanced(fake)


def test_failed_shutdown_does_not_lose_the_snapshot() -> None:
    fake = FakeNvml(errors={"nvmlShutdown": pynvml.NVML_ERROR_UNKNOWN})
    assert snapshot_gpus(fake).body["gpus"] == [H200_ENTRY]


def test_snapshots_are_deterministic() -> None:
    one = snapshot_gpus(FakeNvml(devices=3, not_supported={"nvmlDeviceGetEccMode"}))
    two = snapshot_gpus(FakeNvml(devices=3, not_supported={"nvmlDeviceGetEccMode"}))
    assert canonicalize(one.body) == canonicalize(two.body)
    assert [gpu["index"] for gpu in one.body["gpus"]] == [0, 1, 2]


def test_fake_refuses_queries_outside_init_and_raises_real_errors() -> None:
    fake = FakeNvml()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetPciInfo(handle).busId == "00000000:19:00.0"
    assert fake.nvmlDeviceGetMemoryInfo(handle).total == 150754820096
    fake.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetName(handle)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        FakeNvml(missing_library=True).nvmlInit()


@pytest.mark.skipif(
    Path("/proc/driver/nvidia").exists(), reason="an NVIDIA driver is loaded on this host"
)
def test_real_pynvml_on_a_host_without_a_driver() -> None:
    snap = snapshot_gpus()
    assert snap.body["gpus"] == []
    assert snap.body["driver_version"] is None
    assert snap.body["cuda_driver_version"] is None
    assert snap.body["unknown"]["gpus"]
    assert snap.identity["gpu_uuids"] == []
