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
from functools import partial
from typing import Any, TypeVar

from collectors.gpu_visibility import Device, Visibility, select

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


def snapshot_gpus(
    nvml: Any = None, visibility: Visibility | None = None, *, unseen: str | None = None
) -> GpuSnapshot:
    """Read the GPUs through ``nvml`` (default: the real ``pynvml``); never raises NVMLError.

    ``visibility`` (the engine's ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES``,
    ``collectors.gpu_visibility``) keeps the devices the engine uses, in its order; ``None``
    keeps every device NVML lists, and ``unseen`` (why the engine's environment is unknown)
    is then reported under ``unknown["visible_devices"]`` when there is any device."""
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
        return _collect(nvml, nvml_error, visibility, unseen)
    finally:
        # The values are already read; a failed shutdown changes none of them.
        with contextlib.suppress(nvml_error):
            nvml.nvmlShutdown()


def _collect(
    nvml: Any, nvml_error: type[Exception], visibility: Visibility | None, unseen: str | None
) -> GpuSnapshot:
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
    listed = [reader.listed(index) for index in range(count or 0)]
    chosen, reasons = select([entry[0] for entry in listed], visibility)
    if reasons:
        reader.unknown["visible_devices"] = "; ".join(reasons)
    elif visibility is None and unseen is not None and listed:
        reader.unknown["visible_devices"] = f"{unseen}: every device NVML lists is reported"
    gpus = [
        reader.device(position, listed[pick.index][1:], pick.mig_slot)
        for position, pick in enumerate(chosen)
    ]
    body: dict[str, Any] = {
        "driver_version": driver_version,
        "cuda_driver_version": cuda_driver_version,
        "gpus": gpus,
        "unknown": dict(sorted(reader.unknown.items())),
    }
    identity = {
        "gpu_uuids": reader.uuids,
        "pci_bus_ids": reader.bus_ids,
        "nvml_indexes": [pick.index for pick in chosen],
        "visible_devices": visibility.describe() if visibility is not None else None,
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

    def _quiet(self, fn: Callable[[], _T]) -> _T | None:
        try:
            return fn()
        except self.nvml_error:
            return None

    def listed(self, index: int) -> tuple[Device, tuple[Any, ...] | None, str | None]:
        """Device ``index`` as NVML lists it (UUID, MIG instances), its handle, and why there
        is none. Other failures here only narrow what ``CUDA_VISIBLE_DEVICES`` can name; the
        device's own entry reports them."""
        nvml = self.nvml
        # A one-element tuple, so that a falsy handle is never mistaken for a failed query.
        try:
            found = (nvml.nvmlDeviceGetHandleByIndex(index),)
        except self.nvml_error as exc:
            return Device(index, None), None, f"nvmlDeviceGetHandleByIndex: {exc}"
        (h,) = found
        uuid = self._quiet(lambda: _text(nvml.nvmlDeviceGetUUID(h)))
        name = self._quiet(lambda: _text(nvml.nvmlDeviceGetName(h)))
        mig_enable = _nvml_attr(nvml, "NVML_DEVICE_MIG_ENABLE")
        if self._quiet(lambda: nvml.nvmlDeviceGetMigMode(h)[0]) != mig_enable:
            return Device(index, uuid, name=name), found, None
        slots = self._quiet(lambda: int(nvml.nvmlDeviceGetMaxMigDeviceCount(h))) or 0
        instances: list[tuple[int, str | None]] = []
        for slot in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
            except self.nvml_error:  # NVML_ERROR_NOT_FOUND: an empty slot
                continue
            instances.append((slot, self._quiet(partial(_uuid_of, nvml, mig))))
        return Device(index, uuid, tuple(instances), name), found, None

    def device(
        self,
        position: int,
        listed: tuple[tuple[Any, ...] | None, str | None],
        mig_slot: int | None,
    ) -> dict[str, Any]:
        """The body entry for the engine's device ``position``; its UUID and bus ID go to the
        identity lists. A MIG instance is described by its parent's model and its own size."""
        nvml = self.nvml
        prefix = f"gpus[{position}]"
        found, reason = listed
        if found is None:
            self.unknown[prefix] = reason or "nvmlDeviceGetHandleByIndex failed"
            self.uuids.append(None)
            self.bus_ids.append(None)
            return _gpu_entry(position, None, None, None, None, None, None)
        (h,) = found
        mig = None
        if mig_slot is not None:
            mig = self.query(
                prefix,
                "nvmlDeviceGetMigDeviceHandleByIndex",
                lambda: (nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, mig_slot),),
            )
        own = mig[0] if mig is not None else h  # what the engine runs on
        self.uuids.append(
            self.query(
                f"gpu_uuids[{position}]",
                "nvmlDeviceGetUUID",
                lambda: _text(nvml.nvmlDeviceGetUUID(own)),
                identity=True,
            )
        )
        self.bus_ids.append(
            self.query(
                f"pci_bus_ids[{position}]",
                "nvmlDeviceGetPciInfo",
                lambda: _text(nvml.nvmlDeviceGetPciInfo(h).busId),
                identity=True,
            )
        )
        mig_enable = _nvml_attr(nvml, "NVML_DEVICE_MIG_ENABLE")
        feature_enabled = _nvml_attr(nvml, "NVML_FEATURE_ENABLED")
        capability = self.query(
            f"{prefix}.compute_capability",
            "nvmlDeviceGetCudaComputeCapability",
            lambda: _capability(nvml.nvmlDeviceGetCudaComputeCapability(h)),
        )
        attributes = None
        if mig_slot is not None:
            # NVML answers device attributes for MIG instances only: a whole GPU's handle is
            # NVML_ERROR_NOT_SUPPORTED (seen on an H200, driver 580.159.04).
            attributes = self.query(
                f"{prefix}.multiprocessor_count",
                "nvmlDeviceGetAttributes",
                lambda: nvml.nvmlDeviceGetAttributes(own),
            )
            multiprocessors = (
                int(attributes.multiprocessorCount) if attributes is not None else None
            )
        else:
            multiprocessors = self._multiprocessors(prefix, h, capability)
        entry = _gpu_entry(
            position,
            name=self.query(
                f"{prefix}.name", "nvmlDeviceGetName", lambda: _text(nvml.nvmlDeviceGetName(h))
            ),
            compute_capability=capability,
            memory_total_mib=self.query(
                f"{prefix}.memory_total_mib",
                "nvmlDeviceGetMemoryInfo",
                lambda: int(nvml.nvmlDeviceGetMemoryInfo(own).total) // _MIB,
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
            multiprocessor_count=multiprocessors,
        )
        if mig_slot is None and entry["mig_mode"] == "enabled":
            # CUDA runs on a MIG instance, never on a MIG-enabled GPU as a whole; visibility
            # that names no instance (unset, an ordinal, a GPU UUID) does not say which.
            entry.update(memory_total_mib=None, multiprocessor_count=None, mig_instance=None)
            self.unknown.pop(f"{prefix}.multiprocessor_count", None)
            self.unknown[f"{prefix}.mig_instance"] = (
                "MIG is enabled on this GPU and the engine's CUDA_VISIBLE_DEVICES names no MIG "
                "instance (MIG-<uuid>): the instance CUDA gives it, and its size, are unknown"
            )
        if mig_slot is not None:
            entry["mig_instance"] = (
                {
                    "gpu_instance_slices": int(attributes.gpuInstanceSliceCount),
                    "compute_instance_slices": int(attributes.computeInstanceSliceCount),
                    "memory_mib": int(attributes.memorySizeMB),
                    # the media engines tell a profile from its +me variant (1g.18gb+me)
                    "copy_engines": int(attributes.sharedCopyEngineCount),
                    "decoders": int(attributes.sharedDecoderCount),
                    "encoders": int(attributes.sharedEncoderCount),
                    "jpeg_decoders": int(attributes.sharedJpegCount),
                    "ofa_engines": int(attributes.sharedOfaCount),
                }
                if attributes is not None and mig is not None
                else None
            )
        return entry

    def _multiprocessors(self, prefix: str, h: Any, capability: str | None) -> int | None:
        """A whole GPU's multiprocessors: NVML's CUDA core count over the cores one
        multiprocessor of its compute capability has."""
        key = f"{prefix}.multiprocessor_count"
        per_sm = _CORES_PER_MULTIPROCESSOR.get(capability or "")
        if per_sm is None:
            self.unknown[key] = (
                f"no CUDA cores per multiprocessor known for compute capability {capability}"
                if capability is not None
                else "the compute capability is unknown"
            )
            return None
        cores = self.query(
            key, "nvmlDeviceGetNumGpuCores", lambda: int(self.nvml.nvmlDeviceGetNumGpuCores(h))
        )
        if cores is None:
            return None
        if cores % per_sm:
            self.unknown[key] = (
                f"nvmlDeviceGetNumGpuCores: {cores} cores are not a whole number of "
                f"{per_sm}-core multiprocessors (compute capability {capability})"
            )
            return None
        return cores // per_sm


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


# FP32 CUDA cores per multiprocessor by compute capability, as NVIDIA's CUDA samples list them
# (helper_cuda.h, _ConvertSMVer2Cores), for the capabilities CUDA 12 and 13 build for.
_CORES_PER_MULTIPROCESSOR = {
    "7.0": 64,
    "7.2": 64,
    "7.5": 64,
    "8.0": 64,
    "8.6": 128,
    "8.7": 128,
    "8.9": 128,
    "9.0": 128,
    "10.0": 128,
    "10.1": 128,
    "10.3": 128,
    "11.0": 128,
    "12.0": 128,
    "12.1": 128,
}


def _unavailable(reason: str) -> GpuSnapshot:
    body: dict[str, Any] = {
        "driver_version": None,
        "cuda_driver_version": None,
        "gpus": [],
        "unknown": {"gpus": reason},
    }
    identity: dict[str, Any] = {
        "gpu_uuids": [],
        "pci_bus_ids": [],
        "nvml_indexes": [],
        "visible_devices": None,
        "unknown": {},
    }
    return GpuSnapshot(body=body, identity=identity)


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


def _uuid_of(nvml: Any, handle: Any) -> str:
    return _text(nvml.nvmlDeviceGetUUID(handle))


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
