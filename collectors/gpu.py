"""The GPU part of an environment fingerprint, read from NVML through nvidia-ml-py (``pynvml``).

:func:`snapshot_gpus` returns a :class:`GpuSnapshot` with two halves:

``body``
    What the GPUs *are*: driver version, CUDA driver version and, per device, name, compute
    capability, total memory, MIG mode, ECC mode and multiprocessor count. It goes into the
    fingerprint body, from which the fingerprint ID is derived, so it holds nothing that names
    one machine. Two hosts with the same driver and the same kind of cards produce the same body
    and therefore share a fingerprint ID; replacing a card with an identical one does not mint a
    new ID.

``identity``
    Which physical devices these are: GPU UUIDs and PCI bus IDs. They are kept for the audit
    trail (the record of where a request ran) but stay out of the body: per-machine values in the
    body would give every host its own fingerprint ID and hide the fact that two hosts run the
    same environment.

Nothing is invented. A value NVML cannot give is ``None`` and ``body["unknown"]`` says why,
keyed by the field's path (``"driver_version"``, ``"gpus[0].ecc_mode"``); when NVML cannot be
loaded at all (no driver, a CPU-only host) ``gpus`` is empty and ``unknown["gpus"]`` holds the
reason. Only ``NVMLError`` is turned into a reason: anything else is a bug and propagates, after
``nvmlShutdown``.

Tests pass a fake with pynvml's function names (``tests/support/fake_nvml.py``); the real
module is imported only when no ``nvml`` is given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

_T = TypeVar("_T")

_MIB = 2**20

# NVML_ERROR_* constant name -> what an operator should read when nvmlInit fails with it.
_INIT_REASONS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "NVML library not found: no NVIDIA driver on this host",
    "NVML_ERROR_DRIVER_NOT_LOADED": "NVIDIA kernel driver not loaded",
    "NVML_ERROR_NO_PERMISSION": "no permission to use NVML",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        "NVML library and kernel driver versions differ (driver updated without a reload)"
    ),
}


@dataclass(frozen=True)
class GpuSnapshot:
    """GPU facts split into the ID-bearing ``body`` and the per-machine ``identity``."""

    body: dict[str, Any]
    identity: dict[str, Any]


def snapshot_gpus(nvml: Any = None) -> GpuSnapshot:
    """Read the GPUs through ``nvml`` (default: the real ``pynvml``); never raises NVMLError."""
    if nvml is None:
        try:
            import pynvml
        except ImportError as exc:
            return _unavailable(f"nvidia-ml-py (pynvml) cannot be imported: {exc}")
        nvml = pynvml
    nvml_error = _nvml_attr(nvml, "NVMLError")
    try:
        nvml.nvmlInit()
    except nvml_error as exc:
        return _unavailable(_init_reason(nvml, exc))
    try:
        return _collect(nvml, nvml_error)
    finally:
        # The values are already read; a failed shutdown changes none of them.
        with contextlib.suppress(nvml_error):
            nvml.nvmlShutdown()


def _collect(nvml: Any, nvml_error: type[Exception]) -> GpuSnapshot:
    reader = _Reader(nvml, nvml_error)
    driver_version = reader.query(
        "driver_version",
        "nvmlSystemGetDriverVersion",
        lambda: _text(nvml.nvmlSystemGetDriverVersion()),
    )
    cuda_driver_version = reader.query(
        "cuda_driver_version",
        "nvmlSystemGetCudaDriverVersion",
        lambda: _cuda_version(nvml.nvmlSystemGetCudaDriverVersion()),
    )
    count = reader.query("gpus", "nvmlDeviceGetCount", lambda: int(nvml.nvmlDeviceGetCount()))
    gpus = [reader.device(index) for index in range(count or 0)]
    body: dict[str, Any] = {
        "driver_version": driver_version,
        "cuda_driver_version": cuda_driver_version,
        "gpus": gpus,
        "unknown": dict(sorted(reader.unknown.items())),
    }
    identity = {
        "gpu_uuids": reader.uuids,
        "pci_bus_ids": reader.bus_ids,
        "unknown": dict(sorted(reader.identity_unknown.items())),
    }
    return GpuSnapshot(body=body, identity=identity)


class _Reader:
    """Runs NVML queries, turning each NVMLError into ``None`` plus a reason under its key."""

    def __init__(self, nvml: Any, nvml_error: type[Exception]) -> None:
        self.nvml = nvml
        self.nvml_error = nvml_error
        self.unknown: dict[str, str] = {}
        self.identity_unknown: dict[str, str] = {}
        self.uuids: list[str | None] = []
        self.bus_ids: list[str | None] = []

    def query(
        self, key: str, call: str, fn: Callable[[], _T], *, identity: bool = False
    ) -> _T | None:
        try:
            return fn()
        except self.nvml_error as exc:
            (self.identity_unknown if identity else self.unknown)[key] = f"{call}: {exc}"
            return None

    def device(self, index: int) -> dict[str, Any]:
        """The body entry for device ``index``; its UUID and bus ID go to the identity lists."""
        nvml = self.nvml
        prefix = f"gpus[{index}]"
        # A one-element tuple, so that a falsy handle is never mistaken for a failed query.
        found = self.query(
            prefix, "nvmlDeviceGetHandleByIndex", lambda: (nvml.nvmlDeviceGetHandleByIndex(index),)
        )
        if found is None:
            self.uuids.append(None)
            self.bus_ids.append(None)
            return _gpu_entry(index, None, None, None, None, None, None)
        (h,) = found
        self.uuids.append(
            self.query(
                f"gpu_uuids[{index}]",
                "nvmlDeviceGetUUID",
                lambda: _text(nvml.nvmlDeviceGetUUID(h)),
                identity=True,
            )
        )
        self.bus_ids.append(
            self.query(
                f"pci_bus_ids[{index}]",
                "nvmlDeviceGetPciInfo",
                lambda: _text(nvml.nvmlDeviceGetPciInfo(h).busId),
                identity=True,
            )
        )
        mig_enable = _nvml_attr(nvml, "NVML_DEVICE_MIG_ENABLE")
        feature_enabled = _nvml_attr(nvml, "NVML_FEATURE_ENABLED")
        return _gpu_entry(
            index,
            name=self.query(
                f"{prefix}.name", "nvmlDeviceGetName", lambda: _text(nvml.nvmlDeviceGetName(h))
            ),
            compute_capability=self.query(
                f"{prefix}.compute_capability",
                "nvmlDeviceGetCudaComputeCapability",
                lambda: _capability(nvml.nvmlDeviceGetCudaComputeCapability(h)),
            ),
            memory_total_mib=self.query(
                f"{prefix}.memory_total_mib",
                "nvmlDeviceGetMemoryInfo",
                lambda: int(nvml.nvmlDeviceGetMemoryInfo(h).total) // _MIB,
            ),
            mig_mode=self.query(
                f"{prefix}.mig_mode",
                "nvmlDeviceGetMigMode",
                lambda: _enabled(nvml.nvmlDeviceGetMigMode(h)[0], mig_enable),
            ),
            ecc_mode=self.query(
                f"{prefix}.ecc_mode",
                "nvmlDeviceGetEccMode",
                lambda: _enabled(nvml.nvmlDeviceGetEccMode(h)[0], feature_enabled),
            ),
            multiprocessor_count=self.query(
                f"{prefix}.multiprocessor_count",
                "nvmlDeviceGetAttributes",
                lambda: int(nvml.nvmlDeviceGetAttributes(h).multiprocessorCount),
            ),
        )


def _gpu_entry(
    index: int,
    name: str | None,
    compute_capability: str | None,
    memory_total_mib: int | None,
    mig_mode: str | None,
    ecc_mode: str | None,
    multiprocessor_count: int | None,
) -> dict[str, Any]:
    return {
        "index": index,
        "name": name,
        "compute_capability": compute_capability,
        "memory_total_mib": memory_total_mib,
        "mig_mode": mig_mode,
        "ecc_mode": ecc_mode,
        "multiprocessor_count": multiprocessor_count,
    }


def _unavailable(reason: str) -> GpuSnapshot:
    body: dict[str, Any] = {
        "driver_version": None,
        "cuda_driver_version": None,
        "gpus": [],
        "unknown": {"gpus": reason},
    }
    return GpuSnapshot(body=body, identity={"gpu_uuids": [], "pci_bus_ids": [], "unknown": {}})


def _init_reason(nvml: Any, exc: Exception) -> str:
    value = getattr(exc, "value", None)
    for constant, reason in _INIT_REASONS.items():
        if value == _nvml_attr(nvml, constant):
            return reason
    return f"nvmlInit: {exc}"


def _nvml_attr(nvml: Any, name: str) -> Any:
    """An NVML constant or error class: from ``nvml`` when it has it, else from pynvml."""
    if hasattr(nvml, name):
        return getattr(nvml, name)
    import pynvml

    return getattr(pynvml, name)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(value: int) -> str:
    """NVML's integer CUDA version (13000, 12080) as "major.minor" ("13.0", "12.8")."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def _capability(value: tuple[int, int]) -> str:
    major, minor = value
    return f"{major}.{minor}"


def _enabled(current: int, enabled_value: int) -> str:
    return "enabled" if current == enabled_value else "disabled"
