"""Which of the host's GPUs an engine uses: its ``CUDA_VISIBLE_DEVICES`` applied to NVML's list.

NVML enumerates every device the collector's container can open; the engine may use fewer.
Two variables of the engine's environment narrow the list, in this order:

``NVIDIA_VISIBLE_DEVICES``
    The NVIDIA container runtime's choice of devices for the engine's container: ``all``,
    ``none`` (no device), or a comma-separated list of ``GPU-`` UUIDs, ``MIG-`` UUIDs of
    MIG instances, host indexes ``N`` and MIG devices ``N:M`` (GPU ``N``'s MIG device ``M``).
    Applied only when it differs from the collector's own value: a collector whose container
    holds the same devices (compose gives both the same ``device_ids``) already enumerates
    exactly those. Both values are read as the runtime reads them: a name given twice takes its
    last value (Docker appends the reserved ``device_ids`` after the CUDA image's ``all``), so
    the collector reads its own from ``/proc/self/environ`` as it reads the engine's, not from
    ``os.environ`` (which keeps the first). Host indexes apply only when the collector's NVML
    numbers devices as the host does (its own value unset or ``all``); in a container of its
    own they would name other devices, so they are reported and not applied. A path (the
    runtime's volume-mounts strategy) is reported and not applied; so are ``void`` and an
    empty value, which the runtime reads as unset (it exposes no device itself: any the engine
    has were injected another way, as CDI specs say with ``void``).
``CUDA_VISIBLE_DEVICES``
    What CUDA shows the process, relative to that list, in the order given: device ordinals,
    ``GPU-`` UUIDs or unique prefixes of them, and ``MIG-`` UUIDs of MIG instances. Unset: every
    device. Empty: none. As CUDA does, parsing stops at the first entry that names no device
    (or names one twice): the entries before it count, the rest do not, and the reason is
    reported.

CUDA numbers devices fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; NVML numbers them
by PCI bus. The two agree when the devices are of one model (ties go by bus). Among devices of
different models (told apart by name, as vLLM warns of them) without ``PCI_BUS_ID``, CUDA's
ordinals are not mapped: an ordinal entry leaves ``CUDA_VISIBLE_DEVICES`` unapplied (every
device of the list is reported), and without one the order is reported as unsure.

The result is the engine's devices in the engine's order (``cuda:0`` first), each a whole GPU
or one MIG instance of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collectors.procinfo import own_environ

CUDA = "CUDA_VISIBLE_DEVICES"
CONTAINER = "NVIDIA_VISIBLE_DEVICES"
ORDER = "CUDA_DEVICE_ORDER"
BUS_ORDER = "PCI_BUS_ID"  # the value that makes CUDA number devices as NVML does
_NO_DEVICES = ("none",)
_NOT_SAID = ("void", "")  # read by the runtime as unset


@dataclass(frozen=True)
class Visibility:
    """The engine's two variables as it sees them (``None``: unset, or not to be applied)."""

    cuda: str | None = None
    container: str | None = None
    host_indexes: bool = True  # whether NVML's indexes here are the host's
    bus_order: bool = False  # CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA numbers devices as NVML does

    @classmethod
    def of_engine(
        cls, env: Mapping[str, str] | None, own: Mapping[str, str] | None = None
    ) -> Visibility | None:
        """From the engine's environment (``None`` when it could not be read: every device
        is reported, and the caller says why)."""
        if env is None:
            return None
        own = own_environ() if own is None else own
        container = env.get(CONTAINER)
        mine = own.get(CONTAINER)
        if container is not None and container.strip() == (mine or "").strip():
            container = None  # the collector's container holds the same devices
        host = mine is None or mine.strip().lower() == "all"
        return cls(
            cuda=env.get(CUDA),
            container=container,
            host_indexes=host,
            bus_order=env.get(ORDER) == BUS_ORDER,
        )

    def describe(self) -> dict[str, str | None]:
        return {CUDA: self.cuda, CONTAINER: self.container}


@dataclass(frozen=True)
class Device:
    """One device NVML lists: its index, UUID, and the UUIDs of its MIG instances (by the
    instance's position among the parent's MIG device handles)."""

    index: int
    uuid: str | None
    mig: Sequence[tuple[int, str | None]] = ()
    name: str | None = None  # the model, as NVML names it


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
    units = [Chosen(d.index) for d in devices]
    if visibility is None:
        return units, reasons
    if visibility.container is not None:
        units = _container(devices, visibility, reasons)
    by_index = {d.index: d for d in devices}
    # a model that cannot be read may be another: unsure as well
    names = [by_index[i].name for i in {u.index for u in units}]
    mixed = not visibility.bus_order and len(names) > 1 and (None in names or len(set(names)) > 1)
    if visibility.cuda is None:
        if mixed:
            reasons.append(_MIXED + ": the engine's order of them (each index) is unsure")
        return units, reasons
    if mixed and any(_digits(entry) for entry in _entries(visibility.cuda)):
        reasons.append(
            f"{CUDA} is {visibility.cuda!r}: {_MIXED}, so its ordinals may name other devices "
            f"than NVML's: every device is reported (name devices by UUID, or set {ORDER}="
            f"{BUS_ORDER})"
        )
        return units, reasons
    return _cuda(devices, units, visibility.cuda, reasons), reasons


_MIXED = (
    f"the devices are of different models (or one's model cannot be read) and {ORDER} is not "
    f"{BUS_ORDER}: CUDA numbers them fastest first, NVML by PCI bus"
)


def _entries(value: str) -> list[str]:
    return [] if not value.strip() else [part.strip() for part in value.split(",")]


def _container(
    devices: Sequence[Device], visibility: Visibility, reasons: list[str]
) -> list[Chosen]:
    value = str(visibility.container).strip()
    if value.lower() == "all":
        return [Chosen(d.index) for d in devices]
    if value.lower() in _NO_DEVICES:
        return []
    if value.startswith("/"):
        reasons.append(
            f"{CONTAINER} is {value!r}: the runtime gives the devices as volume mounts, which "
            "the collector does not read; every device NVML lists is reported"
        )
        return [Chosen(d.index) for d in devices]
    if value.lower() in _NOT_SAID:
        reasons.append(
            f"{CONTAINER} is {value!r}, which the runtime reads as unset: the devices are "
            "injected another way (a CDI spec), which the collector does not read; every "
            "device NVML lists is reported"
        )
        return [Chosen(d.index) for d in devices]
    kept: list[Chosen] = []
    for entry in _entries(value):
        found = _container_entry(devices, entry, visibility.host_indexes)
        if isinstance(found, str):
            reasons.append(f"{CONTAINER} entry {entry!r} {found}")
        elif found not in kept:
            kept.append(found)
    # the runtime mounts them in host order
    return sorted(kept, key=lambda c: (c.index, -1 if c.mig_slot is None else c.mig_slot))


def _container_entry(devices: Sequence[Device], entry: str, host_indexes: bool) -> Chosen | str:
    """The device an entry names, or why it names none."""
    gpu, colon, slot = entry.partition(":")
    if _digits(gpu) and (not colon or _digits(slot)):
        if not host_indexes:
            return (
                "is a host index, and this collector's container numbers its own devices: "
                "name devices by UUID, or give the collector the engine's devices"
            )
        for d in devices:
            if d.index == int(gpu):
                if not colon:
                    return Chosen(d.index)
                if any(at == int(slot) and uuid is not None for at, uuid in d.mig):
                    return Chosen(d.index, int(slot))
        return "names no device NVML lists"
    for d in devices:
        if d.uuid is not None and d.uuid == entry:
            return Chosen(d.index)
        for at, uuid in d.mig:
            if uuid is not None and uuid == entry:
                return Chosen(d.index, at)
    return "names no device NVML lists"


def _cuda(
    devices: Sequence[Device], units: list[Chosen], value: str, reasons: list[str]
) -> list[Chosen]:
    chosen: list[Chosen] = []
    for entry in _entries(value):
        device = _resolve(devices, units, entry)
        if device is None or device in chosen:
            why = "names no device" if device is None else "repeats a device"
            reasons.append(
                f"{CUDA} entry {entry!r} {why}: CUDA ignores it and every entry after it"
            )
            break
        chosen.append(device)
    return chosen


def _resolve(devices: Sequence[Device], units: list[Chosen], entry: str) -> Chosen | None:
    if _digits(entry):
        ordinal = int(entry)
        return units[ordinal] if ordinal < len(units) else None
    by_index = {d.index: d for d in devices}
    hits: list[Chosen] = []
    for unit in units:
        device = by_index[unit.index]
        if entry.startswith("MIG-"):
            slots = (
                device.mig
                if unit.mig_slot is None
                else [(at, uuid) for at, uuid in device.mig if at == unit.mig_slot]
            )
            hits += [
                Chosen(unit.index, at)
                for at, uuid in slots
                if uuid is not None and uuid.startswith(entry)
            ]
        elif (
            entry.startswith("GPU-")
            and unit.mig_slot is None
            and device.uuid is not None
            and device.uuid.startswith(entry)
        ):
            hits.append(unit)
    hits = list(dict.fromkeys(hits))  # one instance, held whole and by itself, is one
    return hits[0] if len(hits) == 1 else None  # a prefix must name one device


def _digits(text: str) -> bool:
    """ASCII digits only, as CUDA and the container runtime read indexes."""
    return text.isascii() and text.isdigit()
