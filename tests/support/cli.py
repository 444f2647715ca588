"""Run the ``ledger`` CLI as a user would: a subprocess, its exit code and output."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from demo.server_thread import free_port

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


def serve(
    data_dir: Path, extra_env: dict[str, str], port: int | None = None
) -> tuple[subprocess.Popen[str], str]:
    """``ledger serve`` on ``port`` (a free one by default), once it answers /healthz."""
    port = port or free_port()
    env = {**os.environ, "LEDGER_DATA_DIR": str(data_dir), "LEDGER_PORT": str(port), **extra_env}
    proc = subprocess.Popen(
        [*LEDGER, "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"ledger serve exited: {output}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("ledger serve did not answer within 60 s")
