"""The GPU check for a machine without vLLM: the collector's NVML snapshot and runtime probe on
the real GPU, and the phenomenon the ledger exists for, measured in torch on the fixture model.

Needs torch (CUDA), transformers, tokenizers, numpy and nvidia-ml-py, nothing else: it imports
only the parts of this repository that need no more (``collectors.gpu``, the runtime probe as
a script, the fixture model's builder). Sized for a few minutes on one GPU:

1. NVML: ``collectors.gpu.snapshot_gpus`` (with the process's own CUDA_VISIBLE_DEVICES),
   every field checked against ``nvidia-smi --query-gpu``; the runtime probe run by this
   interpreter (the collector runs it with the engine's).
2. Batch variance: --prompts prompts of --length tokens each (no padding, so a batch changes
   nothing but the batch), next-token log-probabilities at every position computed alone and
   inside batches of 8 and 64, per dtype; reported: the share of prompts whose log-probability
   rows are bitwise equal to the alone run, the largest absolute difference, and the positions
   whose top token changes. The alone run is made twice: its repeat being bitwise equal shows
   that what a batch changes comes from the batch, not from run-to-run nondeterminism.
3. ``--deterministic``: the same with ``torch.use_deterministic_algorithms(True)`` and
   ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, to see whether deterministic kernels are batch-invariant
   (they need not be: determinism is per batch shape).

    python bench/device_check.py --out $OUT      # writes device-check.json there

Run on the device machine with ``run`` (see the tool's README), e.g.
``PYTHONUNBUFFERED=1 timeout 300 python bench/device_check.py --out $OUT``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMI_FIELDS = (
    "name",
    "uuid",
    "pci.bus_id",
    "driver_version",
    "memory.total",
    "compute_cap",
    "mig.mode.current",
    "ecc.mode.current",
)


def nvml_against_smi() -> dict[str, Any]:
    from collectors.gpu import snapshot_gpus
    from collectors.gpu_visibility import Visibility

    snap = snapshot_gpus(None, Visibility.of_engine(dict(os.environ), {}))
    try:
        smi = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"snapshot": snap.body, "identity": snap.identity, "nvidia_smi": f"failed: {exc}"}
    rows = [
        dict(zip(SMI_FIELDS, (c.strip() for c in line.split(",")), strict=True))
        for line in smi.splitlines()
        if line.strip()
    ]
    checks = []
    for position, gpu in enumerate(snap.body["gpus"]):
        index = snap.identity["nvml_indexes"][position]
        row = rows[index] if index < len(rows) else {}
        checks.append(
            {
                "name": gpu["name"] == row.get("name"),
                "uuid": snap.identity["gpu_uuids"][position] == row.get("uuid"),
                "pci_bus_id": (snap.identity["pci_bus_ids"][position] or "").upper()
                == row.get("pci.bus_id", "").upper(),
                "driver_version": snap.body["driver_version"] == row.get("driver_version"),
                "memory_total_mib": str(gpu["memory_total_mib"]) == row.get("memory.total"),
                "compute_capability": gpu["compute_capability"] == row.get("compute_cap"),
                "mig_mode": gpu["mig_mode"] == str(row.get("mig.mode.current", "")).lower()
                or row.get("mig.mode.current") in ("[N/A]", "N/A"),
                "ecc_mode": gpu["ecc_mode"] == str(row.get("ecc.mode.current", "")).lower(),
            }
        )
    try:  # nvidia-smi does not list multiprocessors; CUDA, through torch, does
        import torch

        if torch.cuda.is_available():
            for position, check in enumerate(checks):
                sms = torch.cuda.get_device_properties(position).multi_processor_count
                gpu = snap.body["gpus"][position]
                check["multiprocessor_count_as_cuda"] = gpu["multiprocessor_count"] == sms
    except ImportError:
        pass
    filled = (
        bool(snap.body["gpus"])
        and not snap.body["unknown"]
        and all(v is not None for g in snap.body["gpus"] for v in g.values())
    )
    return {
        "snapshot": snap.body,
        "identity": snap.identity,
        "nvidia_smi": rows,
        "agrees_with_nvidia_smi": checks,
        "every_field_filled": filled,
        "all_agree": bool(checks) and all(all(c.values()) for c in checks),
    }


def visibility_on_real_nvml() -> dict[str, Any]:
    """The engine's CUDA_VISIBLE_DEVICES applied to real NVML's list: by UUID, by a UUID's
    prefix, by index; empty, an index past the last device and an unknown UUID give none."""
    from collectors.gpu import snapshot_gpus
    from collectors.gpu_visibility import Visibility

    every = snapshot_gpus(None, None)
    uuids = every.identity["gpu_uuids"]
    if not uuids:
        return {"skipped": "NVML lists no device", "unknown": every.body["unknown"]}
    first = uuids[0]
    cases = {
        "uuid": (first, [first]),
        "uuid_prefix": (first[:12], [first]),
        "index_0": ("0", [first]),
        "reversed": (",".join(str(i) for i in reversed(range(len(uuids)))), uuids[::-1]),
        "empty": ("", []),
        "index_past_last": (str(len(uuids)), []),
        "unknown_uuid": ("GPU-00000000-0000-0000-0000-000000000000", []),
    }
    out: dict[str, Any] = {}
    for name, (value, expected) in cases.items():
        snap = snapshot_gpus(None, Visibility.of_engine({"CUDA_VISIBLE_DEVICES": value}, {}))
        out[name] = {
            "CUDA_VISIBLE_DEVICES": value,
            "gpu_uuids": snap.identity["gpu_uuids"],
            "unknown": snap.body["unknown"],
            "as_expected": snap.identity["gpu_uuids"] == expected,
        }
    out["all_as_expected"] = all(case["as_expected"] for case in out.values())
    return out


def runtime_probe() -> dict[str, Any]:
    probe = ROOT / "collectors" / "runtime_probe.py"
    done = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return {"failed": done.stderr[-2000:]}
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def runtime_against_torch(found: dict[str, Any]) -> dict[str, Any]:
    """What the probe read from package metadata, beside what torch itself reports."""
    import torch

    torch_says: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        cudnn = torch.backends.cudnn.version()
        torch_says["cudnn"] = (
            f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if cudnn else None
        )
        nccl = torch.cuda.nccl.version()
        torch_says["nccl"] = ".".join(str(p) for p in nccl) if nccl else None
    try:
        import triton

        torch_says["triton"] = triton.__version__
    except ImportError:
        torch_says["triton"] = None

    def same_release(probe: Any, torch_value: Any) -> bool:
        # pip names the release (9.13.0.50), torch the runtime's (9.13.0): compare what both give.
        if probe is None or torch_value is None:
            return probe is None and torch_value is None
        a, b = str(probe).split("+")[0].split("."), str(torch_value).split("+")[0].split(".")
        n = min(len(a), len(b), 3)
        return a[:n] == b[:n]

    agree = {
        key: same_release(found.get(key), torch_says.get(key))
        for key in ("torch", "torch_cuda", "cudnn", "nccl", "triton")
        if key in torch_says
    }
    return {"torch_reports": torch_says, "agrees": agree, "all_agree": all(agree.values())}


def batch_variance(prompts: int, length: int, dtypes: list[str], device: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from fixture_model import build

    model_dir = Path(tempfile.mkdtemp()) / "small"
    build(model_dir, size="small")
    generator = torch.Generator().manual_seed(0)
    results: dict[str, Any] = {"model": "fixture small", "prompts": prompts, "length": length}
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        vocab = model.config.vocab_size
        ids = torch.randint(3, vocab, (prompts, length), generator=generator).to(device)

        def logprobs(batch: torch.Tensor, model: Any = model) -> torch.Tensor:
            with torch.no_grad():
                return torch.log_softmax(model(batch).logits.float(), dim=-1)

        alone = torch.stack([logprobs(ids[i : i + 1])[0] for i in range(prompts)])
        again = torch.stack([logprobs(ids[i : i + 1])[0] for i in range(prompts)])
        by_batch: dict[str, Any] = {
            "alone_repeat": {
                "prompts_bitwise_equal": round(
                    (again == alone).all(dim=-1).all(dim=-1).float().mean().item(), 4
                ),
                "max_abs_difference": (again - alone).abs().max().item(),
            }
        }
        for size in (8, 64):
            if size > prompts:
                continue
            started = time.perf_counter()
            batched = torch.cat([logprobs(ids[i : i + size]) for i in range(0, prompts, size)])
            if device == "cuda":
                torch.cuda.synchronize()
            same = (batched == alone).all(dim=-1)  # per prompt and position
            flips = (batched.argmax(-1) != alone.argmax(-1)).sum().item()
            by_batch[str(size)] = {
                "prompts_bitwise_equal": round(same.all(dim=-1).float().mean().item(), 4),
                "positions_bitwise_equal": round(same.float().mean().item(), 4),
                "max_abs_difference": (batched - alone).abs().max().item(),
                "top_token_changes": int(flips),
                "seconds": round(time.perf_counter() - started, 3),
            }
        results[dtype_name] = by_batch
        del model, logprobs
        if device == "cuda":
            torch.cuda.empty_cache()
    results["torch"] = torch.__version__
    results["cuda"] = torch.version.cuda
    results["device"] = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return results


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    ap.add_argument("--device", default="cuda", help="cuda; cpu for a dry run of the script")
    ap.add_argument(
        "--deterministic",
        action="store_true",
        help="torch.use_deterministic_algorithms(True); writes device-check-deterministic.json",
    )
    args = ap.parse_args()
    if args.deterministic:
        # Read by cuBLAS when its first handle is made, so before torch touches the GPU.
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        import torch

        torch.use_deterministic_algorithms(True)
    started = time.perf_counter()
    report: dict[str, Any] = {"deterministic_algorithms": args.deterministic}
    report["nvml"] = nvml_against_smi()
    print(
        "nvml: every field filled",
        report["nvml"].get("every_field_filled"),
        "agrees with nvidia-smi",
        report["nvml"].get("all_agree"),
        flush=True,
    )
    report["visibility"] = visibility_on_real_nvml()
    print("visibility on real NVML as expected:", report["visibility"].get("all_as_expected"))
    report["runtime"] = runtime_probe()
    print(
        "runtime:",
        {
            k: report["runtime"].get(k)
            for k in ("torch", "torch_cuda", "cublas", "cudnn", "nccl", "triton")
        },
        flush=True,
    )
    report["runtime_against_torch"] = runtime_against_torch(report["runtime"])
    print("runtime agrees with torch:", report["runtime_against_torch"]["agrees"], flush=True)
    report["batch_variance"] = batch_variance(
        args.prompts, args.length, args.dtypes.split(","), args.device
    )
    for dtype in args.dtypes.split(","):
        for size, cell in report["batch_variance"][dtype].items():
            if size == "alone_repeat":
                print(
                    f"{dtype} alone, repeated: prompts bitwise equal "
                    f"{cell['prompts_bitwise_equal']}, max |diff| {cell['max_abs_difference']:.3g}",
                    flush=True,
                )
                continue
            print(
                f"{dtype} batch {size}: prompts bitwise equal to alone "
                f"{cell['prompts_bitwise_equal']}, max |diff| {cell['max_abs_difference']:.3g}, "
                f"top-token changes {cell['top_token_changes']}",
                flush=True,
            )
    report["seconds"] = round(time.perf_counter() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "device-check-deterministic.json" if args.deterministic else "device-check.json"
    (args.out / name).write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"report: {args.out / name} ({report['seconds']} s)")


if __name__ == "__main__":
    main()
