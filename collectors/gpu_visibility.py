"""Which of the host's GPUs an engine uses: its ``CUDA_VISIBLE_DEVICES`` applied to NVML's list.

NVML enumerates every device the collector's container can open; the engine may use fewer.
Two variables of the engine's environment narrow the list, in this order:

``NVIDIA_VISIBLE_DEVICES``
    The NVIDIA container runtime's choice of devices for the engine's container: ``all``,
    ``none``/``void``/empty (no device), or a comma-separated list of host indexes or UUIDs.
    Applied only when it differs from the collector's own value: a collector whose container
    holds the same devices (compose gives both the same ``device_ids``) already enumerates
    exactly those, and host indexes would not apply to its container-relative list.
``CUDA_VISIBLE_DEVICES``
    What CUDA shows the process, relative to that list, in the order given: device ordinals,
    ``GPU-`` UUIDs or unique prefixes of them, and ``MIG-`` UUIDs of MIG instances. Unset: every
    device. Empty: none. As CUDA does, parsing stops at the first entry that names no device
    (or names one twice): the entries before it count, the rest do not, and the reason is
    reported.

The result is the engine's devices in the engine's order (``cuda:0`` first), each a whole GPU
or one MIG instance of it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CUDA = "CUDA_VISIBLE_DEVICES"
CONTAINER = "NVIDIA_VISIBLE_DEVICES"
_NO_DEVICES = ("none", "void", "")


@dataclass(frozen=True)
class Visibility:
    """The engine's two variables as it sees them (``None``: unset, or not to be applied)."""

    cuda: str | None = None
    container: str | None = None

    @classmethod
    def of_engine(
        cls, env: Mapping[str, str] | None, own: Mapping[str, str] | None = None
    ) -> Visibility | None:
        """From the engine's environment (``None`` when it could not be read: every device
        is reported, and the caller says why)."""
        if env is None:
            return None
        own = os.environ if own is None else own
        container = env.get(CONTAINER)
        if container is not None and container.strip() == own.get(CONTAINER, "").strip():
            container = None  # the collector's container holds the same devices
        return cls(cuda=env.get(CUDA), container=container)

    def describe(self) -> dict[str, str | None]:
        return {CUDA: self.cuda, CONTAINER: self.container}


@dataclass(frozen=True)
class Device:
    """One device NVML lists: its index, UUID, and the UUIDs of its MIG instances (by the
    instance's position among the parent's MIG device handles)."""

    index: int
    uuid: str | None
    mig: Sequence[tuple[int, str | None]] = ()


@dataclass(frozen=True)
class Chosen:
    """One device the engine sees: NVML index, and the MIG slot when it is a MIG instance."""

    index: int
    mig_slot: int | None = None


def select(
    devices: Sequence[Device], visibility: Visibility | None
) -> tuple[list[Chosen], list[str]]:
    """The engine's devices in its order, and the reasons for entries that were not applied."""
    reasons: list[str] = []
    if visibility is None:
        return [Chosen(d.index) for d in devices], reasons
    pool = list(devices)
    if visibility.container is not None:
        pool = _container(pool, visibility.container, reasons)
    if visibility.cuda is None:
        return [Chosen(d.index) for d in pool], reasons
    return _cuda(pool, visibility.cuda, reasons), reasons


def _entries(value: str) -> list[str]:
    return [] if not value.strip() else [part.strip() for part in value.split(",")]


def _container(pool: list[Device], value: str, reasons: list[str]) -> list[Device]:
    if value.strip().lower() == "all":
        return pool
    if value.strip().lower() in _NO_DEVICES:
        return []
    kept: list[Device] = []
    for entry in _entries(value):
        found = [d for d in pool if str(d.index) == entry or d.uuid == entry]
        if not found:
            reasons.append(f"{CONTAINER} entry {entry!r} names no device NVML lists")
        elif found[0] not in kept:
            kept.append(found[0])
    return sorted(kept, key=lambda d: d.index)  # the runtime mounts them in host order


def _cuda(pool: list[Device], value: str, reasons: list[str]) -> list[Chosen]:
    chosen: list[Chosen] = []
    for entry in _entries(value):
        device = _resolve(pool, entry)
        if device is None or device in chosen:
            why = "names no device" if device is None else "repeats a device"
            reasons.append(
                f"{CUDA} entry {entry!r} {why}: CUDA ignores it and every entry after it"
            )
            break
        chosen.append(device)
    return chosen


def _resolve(pool: list[Device], entry: str) -> Chosen | None:
    if entry.isdigit():
        ordinal = int(entry)
        return Chosen(pool[ordinal].index) if ordinal < len(pool) else None
    if entry.startswith("MIG-"):
        hits = [
            Chosen(d.index, slot)
            for d in pool
            for slot, uuid in d.mig
            if uuid is not None and uuid.startswith(entry)
        ]
    elif entry.startswith("GPU-"):
        hits = [Chosen(d.index) for d in pool if d.uuid is not None and d.uuid.startswith(entry)]
    else:
        return None
    return hits[0] if len(hits) == 1 else None  # a prefix must name one device
