"""The devices an engine uses: its CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES applied to
what NVML lists (the project's NVML fake mirrors pynvml's calls and an HGX H200 board)."""

from __future__ import annotations

import os
from typing import Any

import pynvml
import pytest

from collectors import gpu_visibility
from collectors.gpu import snapshot_gpus
from collectors.gpu_visibility import Visibility
from collectors.procinfo import own_environ, parse_environ
from tests.support.fake_nvml import FakeMig, FakeNvml, h200

BOARD = [h200(i) for i in range(4)]
MIG_ON = (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE)
MIG_A = "MIG-8c1b3f0e-5a2d-5d7e-9f41-0a6b2c3d4e5f"
MIG_B = "MIG-b2e4d6f8-1a3c-5e7a-9c1e-3b5d7f9a1c3e"


def visible(cuda: str | None = None, container: str | None = None, own: str | None = None):
    env = {}
    if cuda is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda
    if container is not None:
        env["NVIDIA_VISIBLE_DEVICES"] = container
    return Visibility.of_engine(env, {} if own is None else {"NVIDIA_VISIBLE_DEVICES": own})


def snap(visibility: Visibility | None, devices: Any = BOARD):
    return snapshot_gpus(FakeNvml(devices=devices), visibility)


def uuids(s) -> list[str]:
    return s.identity["gpu_uuids"]


@pytest.mark.parametrize(
    "cuda, expected",
    [
        ("2,0", [2, 0]),  # the engine's order: its cuda:0 is NVML's device 2
        (" 3 ", [3]),
        (BOARD[1].uuid, [1]),
        (BOARD[3].uuid[:12], [3]),  # a unique prefix, as CUDA accepts
        (f"{BOARD[2].uuid},1", [2, 1]),
    ],
)
def test_only_the_engines_devices_in_its_order(cuda: str, expected: list[int]) -> None:
    s = snap(visible(cuda))
    assert s.identity["nvml_indexes"] == expected
    assert uuids(s) == [BOARD[i].uuid for i in expected]
    assert [g["index"] for g in s.body["gpus"]] == list(range(len(expected)))
    assert "visible_devices" not in s.body["unknown"]


@pytest.mark.parametrize(
    "cuda, expected, entry",
    [
        ("", [], None),  # empty: no device, nothing wrong
        ("-1", [], "'-1' names no device"),
        ("1,7,0", [1], "'7' names no device"),
        ("0,0,1", [0], "'0' repeats a device"),
        ("GPU-", [], "'GPU-' names no device"),  # a prefix of every UUID names none
        ("GPU-3f9c6a1e,2", [0, 2], None),  # unique prefix
        ("nonsense,0", [], "'nonsense' names no device"),
    ],
)
def test_cuda_stops_at_the_first_entry_that_names_no_device(
    cuda: str, expected: list[int], entry: str | None
) -> None:
    s = snap(visible(cuda))
    assert s.identity["nvml_indexes"] == expected
    reason = s.body["unknown"].get("visible_devices")
    if entry is None:
        assert reason is None
    else:
        assert entry in reason and "every entry after it" in reason


def test_unset_means_every_device_and_unknown_env_says_so() -> None:
    assert snap(visible()).identity["nvml_indexes"] == [0, 1, 2, 3]
    s = snapshot_gpus(FakeNvml(devices=BOARD), None, unseen="no engine process")
    assert s.identity["nvml_indexes"] == [0, 1, 2, 3]
    assert s.body["unknown"]["visible_devices"].startswith("no engine process")
    # without a GPU there is nothing to choose: the body is unchanged
    none = snapshot_gpus(FakeNvml(devices=0), None, unseen="no engine process")
    assert "visible_devices" not in none.body["unknown"]


def test_the_same_model_of_gpu_gives_the_same_body_whichever_slot() -> None:
    """Two pools on two slots of one board share an environment (and a fingerprint ID);
    only the identity tells the slots apart."""
    a, b = snap(visible("0")), snap(visible("3"))
    assert a.body == b.body
    assert uuids(a) != uuids(b) and a.identity["pci_bus_ids"] != b.identity["pci_bus_ids"]
    assert snap(visible("0,1")).body != a.body  # two GPUs are another environment


def test_a_profile_and_its_media_extensions_are_told_apart() -> None:
    """1g.18gb and 1g.18gb+me have the same slices, memory and multiprocessors; the +me
    instance also has the GPU's optical-flow engine. Their fingerprints differ."""
    parent = h200(
        0,
        mig_mode=MIG_ON,
        mig_instances=(FakeMig(MIG_A), FakeMig(MIG_B, ofa_engines=1)),
    )
    plain = snap(visible(MIG_A), [parent]).body["gpus"][0]["mig_instance"]
    media = snap(visible(MIG_B), [parent]).body["gpus"][0]["mig_instance"]
    assert {k: v for k, v in media.items() if k != "ofa_engines"} == {
        k: v for k, v in plain.items() if k != "ofa_engines"
    }
    assert (plain["ofa_engines"], media["ofa_engines"]) == (0, 1)


def test_mig_instances_by_uuid_with_their_profile() -> None:
    parent = h200(
        0,
        mig_mode=MIG_ON,
        mig_instances=(
            FakeMig(MIG_A),
            None,  # an empty slot: NVML_ERROR_NOT_FOUND
            FakeMig(MIG_B, 2, 2, 32768, 32, copy_engines=2, decoders=2, jpeg_decoders=2),
        ),
    )
    s = snap(visible(MIG_B), [parent, h200(1)])
    assert uuids(s) == [MIG_B]
    assert s.identity["nvml_indexes"] == [0]
    (entry,) = s.body["gpus"]
    assert entry["name"] == "NVIDIA H200" and entry["mig_mode"] == "enabled"
    assert entry["memory_total_mib"] == 32768 and entry["multiprocessor_count"] == 32
    assert entry["mig_instance"] == {
        "gpu_instance_slices": 2,
        "compute_instance_slices": 2,
        "memory_mib": 32768,
        "copy_engines": 2,
        "decoders": 2,
        "encoders": 0,
        "jpeg_decoders": 2,
        "ofa_engines": 0,
    }
    small = snap(visible(MIG_A[:10]), [parent]).body["gpus"][0]
    assert small["mig_instance"]["gpu_instance_slices"] == 1
    assert small["memory_total_mib"] == 16384
    # a whole GPU is described without an instance
    assert "mig_instance" not in snap(visible("1"), [parent, h200(1)]).body["gpus"][0]
    # a MIG UUID that the board does not hold names no device
    gone = snap(visible("MIG-00000000"), [parent])
    assert gone.body["gpus"] == [] and "names no device" in gone.body["unknown"]["visible_devices"]


@pytest.mark.parametrize(
    "container, own, cuda, expected",
    [
        ("1,3", None, None, [1, 3]),  # another container's devices, by host index
        ("1,3", None, "1", [3]),  # CUDA_VISIBLE_DEVICES counts within them
        (BOARD[2].uuid, None, None, [2]),
        ("none", None, None, []),
        ("void", None, None, [0, 1, 2, 3]),  # devices injected by CDI: not said here
        ("all", None, "2", [2]),
        ("2", "2", None, [0, 1, 2, 3]),  # the collector's own container: NVML already agrees
    ],
)
def test_the_engines_container_devices(
    container: str, own: str | None, cuda: str | None, expected: list[int]
) -> None:
    s = snap(visible(cuda, container, own))
    assert s.identity["nvml_indexes"] == expected


@pytest.mark.parametrize("value", ["void", "VOID", " "])
def test_void_or_empty_is_reported_and_not_read_as_no_device(value: str) -> None:
    """The runtime reads both as unset (it exposes no device itself): devices the engine has
    were injected another way (CDI writes void), so none is ruled out."""
    s = snap(visible(None, value, "all"))
    assert s.identity["nvml_indexes"] == [0, 1, 2, 3]
    assert "CDI" in s.body["unknown"]["visible_devices"]


def test_a_variable_given_twice_is_read_as_the_runtime_reads_it(tmp_path, monkeypatch) -> None:
    """Compose reserves device 1 for both containers of a pod whose images set
    NVIDIA_VISIBLE_DEVICES=all: Docker appends ``=1``, the runtime gives each container host
    GPU 1 (its NVML index 0 there). Both environments read the same, last value wins: the
    collector's NVML already lists the engine's device, so nothing is narrowed further."""
    raw = b"PATH=/usr/bin\0NVIDIA_VISIBLE_DEVICES=all\0NVIDIA_VISIBLE_DEVICES=1\0X\0"
    assert parse_environ(raw) == {"PATH": "/usr/bin", "NVIDIA_VISIBLE_DEVICES": "1"}
    # what the process reads itself (getenv, os.environ) takes the first value, NVIDIA's
    # variables for cuBLAS too: only those the runtime reads take the last
    twice = (
        b"CUDA_VISIBLE_DEVICES=0\0CUDA_VISIBLE_DEVICES=1\0"
        b"NVIDIA_TF32_OVERRIDE=0\0NVIDIA_TF32_OVERRIDE=1\0"
    )
    assert parse_environ(twice) == {"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_TF32_OVERRIDE": "0"}
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "environ").write_bytes(raw)
    own = own_environ(tmp_path)
    assert own["NVIDIA_VISIBLE_DEVICES"] == "1"
    in_container = [h200(1)]  # what NVML lists in a container holding host GPU 1
    monkeypatch.setattr(gpu_visibility, "own_environ", lambda: own)  # the collector's /proc
    v = Visibility.of_engine(parse_environ(raw))
    assert v is not None and v.container is None  # the same devices as the collector's
    assert snap(v, in_container).identity["gpu_uuids"] == [in_container[0].uuid]
    # os.environ's reading (the first value, all) would have looked for host index 1 here
    assert snap(visible(None, "1", "all"), in_container).body["gpus"] == []
    # without /proc, the process's own variables
    assert own_environ(tmp_path / "absent") is os.environ


def test_an_unreadable_environment_is_not_a_visibility() -> None:
    assert Visibility.of_engine(None) is None
    v = visible("0", "1")
    assert v is not None and v.describe() == {
        "CUDA_VISIBLE_DEVICES": "0",
        "NVIDIA_VISIBLE_DEVICES": "1",
    }


def test_a_container_given_mig_instances_or_host_indexes_it_cannot_map() -> None:
    """Kubernetes' mixed MIG strategy gives a container ``MIG-`` UUIDs, Compose ``N:M``; the
    engine's CUDA then counts within those instances. A host index is applied only where this
    collector's NVML numbers devices as the host does."""
    parent = h200(
        0,
        mig_mode=MIG_ON,
        mig_instances=(FakeMig(MIG_A), None, FakeMig(MIG_B, 2, 2, 32768, 32)),
    )
    board = [parent, h200(1)]
    for container in (MIG_B, "0:2"):
        s = snap(visible(None, container), board)
        assert uuids(s) == [MIG_B], container
        assert s.body["gpus"][0]["mig_instance"]["gpu_instance_slices"] == 2
        assert "visible_devices" not in s.body["unknown"]
        assert uuids(snap(visible("0", container), board)) == [MIG_B]  # cuda:0 is that instance
    two = snap(visible("1", f"{MIG_A},{MIG_B}"), board)
    assert uuids(two) == [MIG_B]
    assert uuids(snap(visible(MIG_A[:12], f"{MIG_A},{MIG_B}"), board)) == [MIG_A]
    # one instance held whole and by itself is one device, not an ambiguous prefix
    assert uuids(snap(visible(MIG_B, "0,0:2"), board)) == [MIG_B]
    # an index is ASCII digits
    assert snap(visible(None, "\uff11"), board).body["gpus"] == []
    assert snap(visible("\uff11"), board).body["gpus"] == []
    # a slot that is empty names nothing, and says so
    empty = snap(visible(None, "0:1"), board)
    assert (
        empty.body["gpus"] == []
        and "'0:1' names no device" in empty.body["unknown"]["visible_devices"]
    )
    # a collector in a container of its own (another device): the engine's host index 0 is
    # not this container's device 0; reported, never guessed
    own = snap(visible(None, "0", own="1"))
    assert own.body["gpus"] == []
    assert "is a host index" in own.body["unknown"]["visible_devices"]
    by_uuid = snap(visible(None, BOARD[2].uuid, own="1"))
    assert by_uuid.identity["nvml_indexes"] == [2]
    assert snap(visible(None, "3", own="all")).identity["nvml_indexes"] == [3]
    # the volume-mounts strategy: not read, every device reported with the reason
    mounted = snap(visible(None, "/var/run/nvidia-container-devices"))
    assert mounted.identity["nvml_indexes"] == [0, 1, 2, 3]
    assert "volume mounts" in mounted.body["unknown"]["visible_devices"]


def test_ordinals_among_devices_of_different_models_are_not_guessed() -> None:
    """CUDA numbers devices fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML by bus:
    on a host mixing models (vLLM warns of it) an ordinal may name another device, so it is
    not applied and the reason says how to name devices; UUIDs still are, and PCI_BUS_ID
    makes the ordinals NVML's."""
    board = [h200(0, name="NVIDIA L40S"), h200(1), h200(2)]

    def with_order(cuda: str | None, order: str | None = None) -> Visibility:
        env = {} if cuda is None else {"CUDA_VISIBLE_DEVICES": cuda}
        if order is not None:
            env["CUDA_DEVICE_ORDER"] = order
        v = Visibility.of_engine(env, {})
        assert v is not None
        return v

    guessed = snap(with_order("0"), board)
    assert guessed.identity["nvml_indexes"] == [0, 1, 2]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in guessed.body["unknown"]["visible_devices"]
    assert snap(with_order("0", "PCI_BUS_ID"), board).identity["nvml_indexes"] == [0]
    by_uuid = snap(with_order(board[2].uuid), board)
    assert by_uuid.identity["nvml_indexes"] == [2] and not by_uuid.body["unknown"]
    every = snap(with_order(None), board)
    assert every.identity["nvml_indexes"] == [0, 1, 2]
    assert "order of them" in every.body["unknown"]["visible_devices"]
    # a model that cannot be read may be another one
    unread = [h200(0), h200(1, not_supported=frozenset({"nvmlDeviceGetName"}))]
    unsure = snap(with_order("1"), unread)
    assert unsure.identity["nvml_indexes"] == [0, 1]
    assert "cannot be read" in unsure.body["unknown"]["visible_devices"]
    # one model: CUDA's ties go by bus, as NVML's order does
    same = snap(with_order("2,0"), [h200(0), h200(1), h200(2)])
    assert same.identity["nvml_indexes"] == [2, 0] and not same.body["unknown"]
