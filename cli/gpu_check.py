"""``ledger gpu-check``: the whole loop on this host's engine, measured, in one report
(the scenario is :mod:`demo.gpu_check`). The exit status is 1 when a strict record does not
replay bitwise or the strict pool does not certify invariant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import typer
from rich.table import Table

from cli.common import (
    JsonOption,
    console,
    fail,
    ledger_errors,
    load_settings,
    print_json,
    show_progress,
)
from cli.tables import table
from demo.gpu_check import has_cuda_gpu, run_gpu_check
from ledger.atomic_file import write_atomically


def _table(report: dict[str, Any]) -> Table:
    out = table("step", "result", "s", wrap=["result"], title=f"gpu-check ({report['device']})")
    steps = report["timings"]
    for pool, facts in report["pools"].items():
        gpu = facts["gpu"]
        names = ", ".join(str(g.get("name")) for g in gpu["gpus"]) or "none"
        out.add_row(
            f"pool {pool}",
            f"batch invariance {facts['batch_invariance']}; GPUs: {names} "
            f"(driver {gpu['driver_version']}, every field filled: {gpu['every_field_filled']})",
            "",
        )
        cost = facts["overhead"]
        out.add_row(
            f"collector cost, {pool}",
            f"added p50 {cost['added_p50_ms']} ms; throughput ratio {cost['throughput_ratio']} "
            f"at concurrency {cost['concurrency']}",
            str(steps.get(f"overhead {pool}", "")),
        )
    t = report["traffic"]
    out.add_row(
        "traffic",
        f"{t['requests']} requests at concurrency {t['concurrency']}: {t['requests_per_s']}/s, "
        f"{t['recorded']} recorded",
        str(steps.get("traffic", "")),
    )
    for pool, r in report["replays"].items():
        out.add_row(
            f"replay {pool}",
            f"{r['replayed']} replayed: {r['verdicts']} (bitwise rate {r['bitwise_rate']}; "
            f"observed {r['observed']})",
            str(r["seconds"]),
        )
    for pool, c in report["certification"].items():
        cells = ", ".join(
            f"c={x['concurrency']}: {x['bitwise']}/{x['requests']}" for x in c["cells"]
        )
        label = "invariant" if c["invariant"] else "NOT invariant"
        out.add_row(f"certify {pool}", f"{label} ({cells})", str(c["seconds"]))
    out.add_row("passed", str(report["passed"]), str(round(sum(steps.values()), 1)))
    return out


def gpu_check(
    device: Literal["auto", "cuda", "cpu"] = typer.Option(
        "auto", help="the engines' device (auto: cuda when NVML lists a GPU)"
    ),
    requests: int = typer.Option(256, min=2, help="mixed requests across both pools"),
    concurrency: int = typer.Option(64, min=1, help="requests in flight at once"),
    certify_concurrency: str = typer.Option("1,16,64", help="certification concurrencies"),
    certify_prompts: int = typer.Option(8, min=1, max=256, help="prompts per certification"),
    throughput_sample: int = typer.Option(16, min=0, help="throughput records to replay"),
    pairs: int = typer.Option(16, min=1, help="paired requests for the collector's added p50"),
    out: Path = typer.Option(Path("gpu-check.json"), "--out", help="the JSON report"),
    data_dir: Path = typer.Option(Path("gpu-check-data"), help="ledger data, logs, model"),
    engine_python: Path = typer.Option(
        Path(".venv-vllm/bin/python"), "--engine-python", help="the vLLM environment's Python"
    ),
    as_json: bool = JsonOption,
) -> None:
    """Run the loop on this host's engine and report it (see `make gpu-check`)."""
    try:
        levels = [int(x) for x in certify_concurrency.split(",") if x.strip()]
    except ValueError:
        fail(f"--certify-concurrency must be integers separated by commas: {certify_concurrency!r}")
    if not levels or min(levels) < 1:
        fail("--certify-concurrency needs at least one level, each at least 1")
    if not engine_python.exists():
        fail(f"{engine_python} does not exist (run `make engine`, or pass --engine-python)")
    mode = device if device != "auto" else ("cuda" if has_cuda_gpu() else "cpu")
    show_progress()
    settings = load_settings(data_dir=data_dir)
    with ledger_errors():
        report = run_gpu_check(
            settings,
            mode,
            engine_python,
            requests=requests,
            concurrency=concurrency,
            levels=levels,
            certify_prompts=certify_prompts,
            throughput_sample=throughput_sample,
            pairs=pairs,
        )
    write_atomically(out, (json.dumps(report, indent=2, sort_keys=True) + "\n").encode())
    if as_json:
        print_json(report)
    else:
        console.print(_table(report))
        console.print(f"report: {out}")
    if not report["passed"]:
        raise typer.Exit(1)
