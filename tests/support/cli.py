"""Run the ``ledger`` CLI as a user would: a subprocess, its exit code and output."""

from __future__ import annotations

import os
import subprocess
import sys

LEDGER = [sys.executable, "-m", "cli"]


def ledger(
    *args: str, env: dict[str, str] | None = None, check: bool = True, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*LEDGER, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc
