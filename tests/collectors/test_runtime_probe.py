"""The runtime probe (run by the engine's interpreter) names the libraries torch loads: the
packages built for torch's CUDA major version when an image holds two, and cuDNN's version as
each cuDNN generation encodes it."""

from __future__ import annotations

import types
from importlib import metadata
from typing import Any

import pytest

from collectors import runtime_probe
from collectors.runtime_probe import cudnn_text, ordered


@pytest.mark.parametrize(
    ("encoded", "text"),
    [(90100, "9.1.0"), (91002, "9.10.2"), (8902, "8.9.2"), (8600, "8.6.0"), (7605, "7.6.5")],
)
def test_cudnn_versions_are_read_as_their_generation_encodes_them(encoded: int, text: str):
    assert cudnn_text(encoded) == text


def test_the_packages_of_torchs_cuda_come_first():
    names = runtime_probe.PACKAGES["cublas"]
    assert ordered(names, 12)[0] == "nvidia-cublas-cu12"
    assert ordered(names, 13)[0] == "nvidia-cublas-cu13"
    assert ordered(names, None) == names
    assert sorted(ordered(names, 12)) == sorted(names)


def _fake_torch(cuda: str | None, cudnn: int) -> Any:
    return types.SimpleNamespace(
        version=types.SimpleNamespace(cuda=cuda),
        backends=types.SimpleNamespace(
            cpu=types.SimpleNamespace(get_cpu_capability=lambda: "AVX512"),
            cudnn=types.SimpleNamespace(version=lambda: cudnn),
        ),
        cuda=types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: (2, 21, 5))),
    )


def test_an_image_with_cu12_and_cu13_wheels_reports_those_of_torchs_cuda(
    monkeypatch: pytest.MonkeyPatch,
):
    installed = {
        "torch": "2.11.0+cu128",
        "nvidia-cublas": "13.0.0.19",
        "nvidia-cublas-cu12": "12.8.4.1",
        "nvidia-cuda-runtime-cu13": "13.0.48",
        "nvidia-cuda-runtime-cu12": "12.8.90",
        "nvidia-cudnn-cu12": "9.10.2.21",
    }

    def version(name: str) -> str:
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(runtime_probe.metadata, "version", version)
    torch = _fake_torch("12.8", 8902)
    monkeypatch.setattr(runtime_probe.importlib, "import_module", lambda name: torch)
    out = runtime_probe.probe()
    assert out["torch_cuda"] == "12.8"
    assert (out["cublas"], out["cuda_runtime"]) == ("12.8.4.1", "12.8.90")
    assert out["cudnn"] == "9.10.2.21"  # the package's; torch's encoding only without one
    assert out["nccl"] == "2.21.5"  # no package: torch's own
    del installed["nvidia-cudnn-cu12"]
    assert runtime_probe.probe()["cudnn"] == "8.9.2"
