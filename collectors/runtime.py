"""The engine's software: Python, vLLM, torch and the CUDA libraries it loads.

Versions must come from the interpreter that runs the engine, not the collector's (they live in
different environments, as they would in different containers), so the probe
(``runtime_probe.py``) runs as a subprocess of the engine's Python: ``--engine-python``, or the
executable of the engine process found through /proc.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.fingerprint import RUNTIME_LIBRARIES

PROBE = Path(__file__).with_name("runtime_probe.py")
PROBE_TIMEOUT = 180.0
FIELDS = (
    "python",
    "python_implementation",
    "machine",
    "cpu_model",
    "cpu_capability",
    *RUNTIME_LIBRARIES,
)


@dataclass(frozen=True)
class RuntimeSnapshot:
    body: dict[str, Any]
    interpreter: str | None


def _unknown_body(reason: str) -> dict[str, Any]:
    body: dict[str, Any] = dict.fromkeys(FIELDS)
    body["unknown"] = {"runtime": reason}
    return body


def snapshot_runtime(
    engine_python: str | None, *, timeout: float = PROBE_TIMEOUT
) -> RuntimeSnapshot:
    """Run the probe with ``engine_python``; every field is present, unknown ones say why."""
    if engine_python is None:
        return RuntimeSnapshot(
            _unknown_body(
                "the engine's interpreter is not known: pass --engine-python, or run the "
                "collector beside the engine so its process can be found"
            ),
            None,
        )
    try:
        done = subprocess.run(
            [engine_python, str(PROBE)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        return RuntimeSnapshot(_unknown_body(f"engine interpreter {engine_python} not found"), None)
    except PermissionError:
        return RuntimeSnapshot(
            _unknown_body(f"engine interpreter {engine_python} is not executable"), None
        )
    except subprocess.TimeoutExpired:
        return RuntimeSnapshot(
            _unknown_body(f"the runtime probe did not finish within {timeout:.0f} s"), None
        )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return RuntimeSnapshot(
            _unknown_body(f"the runtime probe failed (exit {done.returncode}): {tail}"), None
        )
    try:
        found = json.loads(done.stdout)
    except json.JSONDecodeError:
        return RuntimeSnapshot(_unknown_body("the runtime probe printed no JSON"), None)
    body: dict[str, Any] = {field: found.get(field) for field in FIELDS}
    body["unknown"] = dict(found.get("unknown") or {})
    return RuntimeSnapshot(body, engine_python)


def engines_own(runtime: RuntimeSnapshot, served_version: str | None) -> RuntimeSnapshot:
    """``runtime``, unless the interpreter probed has another vLLM than the engine answers
    ``/version`` with (a collector image built on another engine image than the one the engine
    runs): then no field of it describes the engine, and the reason says so."""
    probed = runtime.body.get("vllm")
    if probed is None or served_version in (None, "dev"):  # "dev": vLLM without its version
        return runtime
    # the package's version may carry a build label (0.32.0+cu126) that /version leaves out
    if probed.split("+")[0] == served_version.split("+")[0]:
        return runtime
    return RuntimeSnapshot(
        _unknown_body(
            f"the interpreter probed ({runtime.interpreter}) has vLLM {probed}, the engine "
            f"answers vLLM {served_version}: not the engine's runtime (run the probe in the "
            "engine's environment: build the collector's image on the engine's image)"
        ),
        runtime.interpreter,
    )
