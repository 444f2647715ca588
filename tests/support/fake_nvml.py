"""A stand-in for the ``pynvml`` module (nvidia-ml-py) on machines without a GPU.

:class:`FakeNvml` has the same function names and arguments as nvidia-ml-py and returns the
same types: ``str`` for names, UUIDs and versions; an ``int`` for the CUDA driver version; a
tuple for the compute capability; a two-element ``list`` for MIG and ECC modes (as pynvml
does); and pynvml's own ctypes structures for memory info, device attributes and PCI info
(whose ``__getattribute__`` turns the ``busId`` bytes into ``str``). Failures raise the real
``pynvml.NVMLError(pynvml.NVML_ERROR_...)``, so ``except nvml.NVMLError`` and the
``NVMLError_NotSupported``-style subclasses behave as on a real host. Any other ``NVML_*``
constant or ``NVMLError*`` class is read through from pynvml.

As NVML documents and a real H200 (driver 580.159.04) answered, ``nvmlDeviceGetAttributes``
answers for MIG instances only: a whole GPU's handle raises ``NVML_ERROR_NOT_SUPPORTED``.
``nvmlDeviceGetNumGpuCores`` answers for a whole GPU (an H200: 16,896, 132 multiprocessors of
128 cores); for a MIG instance it raises ``NVML_ERROR_NOT_SUPPORTED`` here, a choice the
collector never relies on, since it asks MIG instances for their attributes instead.

Defaults describe one NVIDIA H200 under driver 580.95.05 (CUDA 13.0). Every call is appended to
:attr:`FakeNvml.calls`; device and system queries outside ``nvmlInit``/``nvmlShutdown`` raise
``NVML_ERROR_UNINITIALIZED``, as the real library does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

H200_MEMORY_TOTAL = 143771 * 2**20  # 150754820096 bytes
H200_UUID = "GPU-3f9c6a1e-0b7d-4c52-9e8a-1d2f3a4b5c6d"
# Bus IDs of the eight SXM slots of an HGX H200 board, as NVML reports them.
HGX_BUS_IDS = (
    "00000000:19:00.0",
    "00000000:3B:00.0",
    "00000000:4C:00.0",
    "00000000:5D:00.0",
    "00000000:9B:00.0",
    "00000000:BB:00.0",
    "00000000:CB:00.0",
    "00000000:DB:00.0",
)


@dataclass(frozen=True)
class FakeGpu:
    """One device's answers. ``not_supported`` names the calls that fail on this device only."""

    uuid: str = H200_UUID
    pci_bus_id: str = HGX_BUS_IDS[0]
    name: str = "NVIDIA H200"
    compute_capability: tuple[int, int] = (9, 0)
    memory_total: int = H200_MEMORY_TOTAL
    memory_used: int = 551 * 2**20
    mig_mode: tuple[int, int] = (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE)
    ecc_mode: tuple[int, int] = (pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_ENABLED)
    cuda_cores: int = 132 * 128
    not_supported: frozenset[str] = frozenset()
    # MIG instances by slot (NVML's MIG device index); the device reports 7 slots when MIG
    # is enabled, as an H200 does, and an empty slot is NVML_ERROR_NOT_FOUND.
    mig_instances: tuple[FakeMig | None, ...] = ()


@dataclass(frozen=True)
class FakeMig:
    """One MIG instance (a GPU instance with one compute instance), as an H200 141 GB
    creates them: ``1g.18gb`` is 1 of 7 slices, 16 SMs, 16,384 MiB, one copy engine, one
    video decoder and one JPEG decoder, no optical-flow engine (``1g.18gb+me``, the media
    extensions: one OFA too)."""

    uuid: str
    gpu_instance_slices: int = 1
    compute_instance_slices: int = 1
    memory_mib: int = 16384
    multiprocessor_count: int = 16
    copy_engines: int = 1
    decoders: int = 1
    encoders: int = 0
    jpeg_decoders: int = 1
    ofa_engines: int = 0


MIG_SLOTS = 7


def h200(index: int = 0, **changes: Any) -> FakeGpu:
    """An H200 in slot ``index``: a UUID and bus ID of its own, other values as ``FakeGpu``."""
    uuid = f"GPU-{0x3F9C6A1E + index:08x}{H200_UUID[12:]}"
    bus_id = HGX_BUS_IDS[index] if index < len(HGX_BUS_IDS) else f"00000000:{index:02X}:00.0"
    return FakeGpu(**{"uuid": uuid, "pci_bus_id": bus_id, **changes})


@dataclass(frozen=True)
class FakeHandle:
    """What ``nvmlDeviceGetHandleByIndex`` returns (pynvml gives an opaque ctypes pointer);
    ``mig_slot`` is set on what ``nvmlDeviceGetMigDeviceHandleByIndex`` returns."""

    index: int
    mig_slot: int | None = None


@dataclass
class FakeNvml:
    """A fake ``pynvml`` module. Pass it wherever code accepts an ``nvml`` module object.

    ``devices`` is a count of default H200s or a list of :class:`FakeGpu`. ``missing_library``
    makes ``nvmlInit`` raise ``NVML_ERROR_LIBRARY_NOT_FOUND`` (a host without a driver);
    ``init_error`` makes it raise any other code. ``not_supported`` names functions that raise
    ``NVML_ERROR_NOT_SUPPORTED`` on every device; ``errors`` maps function names to the
    ``NVML_ERROR_*`` code they raise.
    """

    devices: int | Sequence[FakeGpu] = 1
    missing_library: bool = False
    init_error: int | None = None
    not_supported: Iterable[str] = ()
    errors: Mapping[str, int] = field(default_factory=dict)
    driver_version: str = "580.95.05"
    cuda_driver_version: int = 13000
    calls: list[str] = field(default_factory=list, init=False)
    gpus: list[FakeGpu] = field(init=False)
    initialized: int = field(default=0, init=False)

    NVMLError = pynvml.NVMLError

    def __post_init__(self) -> None:
        if isinstance(self.devices, int):
            self.gpus = [h200(i) for i in range(self.devices)]
        else:
            self.gpus = list(self.devices)
        self.not_supported = frozenset(self.not_supported)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not defined here: NVML_* constants and NVMLError_* classes.
        if name.startswith(("NVML_", "NVMLError")):
            return getattr(pynvml, name)
        raise AttributeError(f"FakeNvml has no {name!r}")

    # -- lifecycle -----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.missing_library:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self._fail_if_configured("nvmlInit")
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self._require_init()
        self._fail_if_configured("nvmlShutdown")
        self.initialized -= 1

    # -- system --------------------------------------------------------------------------------

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    # -- per device ----------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        gpu = self._device("nvmlDeviceGetName", handle)
        mig = self._mig(handle)
        if mig is not None:  # as NVML names a MIG device
            return f"{gpu.name} MIG {mig.gpu_instance_slices}g.{mig.memory_mib // 1024 + 2}gb"
        return gpu.name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        gpu = self._device("nvmlDeviceGetUUID", handle)
        mig = self._mig(handle)
        return mig.uuid if mig is not None else gpu.uuid

    def nvmlDeviceGetMaxMigDeviceCount(self, device: FakeHandle) -> int:
        gpu = self._device("nvmlDeviceGetMaxMigDeviceCount", device)
        if gpu.mig_mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            return 0
        return MIG_SLOTS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: FakeHandle, index: int) -> FakeHandle:
        gpu = self._device("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if device.mig_slot is not None or not 0 <= index < MIG_SLOTS:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.mig_mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if index >= len(gpu.mig_instances) or gpu.mig_instances[index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return FakeHandle(device.index, index)

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> pynvml.nvmlPciInfo_t:
        gpu = self._device("nvmlDeviceGetPciInfo", handle)
        domain, bus, rest = gpu.pci_bus_id.split(":")
        device = rest.split(".")[0]
        return pynvml.nvmlPciInfo_t(
            busIdLegacy=gpu.pci_bus_id[4:].encode(),
            domain=int(domain, 16),
            bus=int(bus, 16),
            device=int(device, 16),
            pciDeviceId=0x233510DE,
            pciSubSystemId=0x18BE10DE,
            busId=gpu.pci_bus_id.encode(),
        )

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeHandle) -> tuple[int, int]:
        return self._device("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    def nvmlDeviceGetMemoryInfo(
        self, handle: FakeHandle, version: int | None = None
    ) -> pynvml.c_nvmlMemory_t:
        gpu = self._device("nvmlDeviceGetMemoryInfo", handle)
        mig = self._mig(handle)
        if mig is not None:
            total = mig.memory_mib * 2**20
            return pynvml.c_nvmlMemory_t(total=total, free=total - 2**20, used=2**20)
        return pynvml.c_nvmlMemory_t(
            total=gpu.memory_total,
            free=gpu.memory_total - gpu.memory_used,
            used=gpu.memory_used,
        )

    def nvmlDeviceGetMigMode(self, device: FakeHandle) -> list[int]:
        return list(self._device("nvmlDeviceGetMigMode", device).mig_mode)

    def nvmlDeviceGetEccMode(self, handle: FakeHandle) -> list[int]:
        return list(self._device("nvmlDeviceGetEccMode", handle).ecc_mode)

    def nvmlDeviceGetNumGpuCores(self, device: FakeHandle) -> int:
        gpu = self._device("nvmlDeviceGetNumGpuCores", device)
        if device.mig_slot is not None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.cuda_cores

    def nvmlDeviceGetAttributes(self, device: FakeHandle) -> pynvml.c_nvmlDeviceAttributes:
        return self._attributes("nvmlDeviceGetAttributes", device)

    def nvmlDeviceGetAttributes_v2(self, device: FakeHandle) -> pynvml.c_nvmlDeviceAttributes:
        return self._attributes("nvmlDeviceGetAttributes_v2", device)

    # -- helpers -------------------------------------------------------------------------------

    def _attributes(self, call: str, device: FakeHandle) -> pynvml.c_nvmlDeviceAttributes:
        self._device(call, device)
        mig = self._mig(device)
        if mig is None:  # a whole GPU: MIG instances only
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlDeviceAttributes(
            multiprocessorCount=mig.multiprocessor_count,
            sharedCopyEngineCount=mig.copy_engines,
            sharedDecoderCount=mig.decoders,
            sharedEncoderCount=mig.encoders,
            sharedJpegCount=mig.jpeg_decoders,
            sharedOfaCount=mig.ofa_engines,
            gpuInstanceSliceCount=mig.gpu_instance_slices,
            computeInstanceSliceCount=mig.compute_instance_slices,
            memorySizeMB=mig.memory_mib,
        )

    def _enter(self, call: str) -> None:
        self.calls.append(call)
        self._require_init()
        self._fail_if_configured(call)

    def _device(self, call: str, handle: FakeHandle) -> FakeGpu:
        self._enter(call)
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        if call in gpu.not_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _mig(self, handle: FakeHandle) -> FakeMig | None:
        if handle.mig_slot is None:
            return None
        mig = self.gpus[handle.index].mig_instances[handle.mig_slot]
        assert mig is not None  # only handed out for a filled slot
        return mig

    def _require_init(self) -> None:
        if self.initialized <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _fail_if_configured(self, call: str) -> None:
        if call in self.errors:
            raise pynvml.NVMLError(self.errors[call])
        if call in self.not_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
