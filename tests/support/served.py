"""``ledger serve --workers N`` as a real subprocess in its own process group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.cli import LEDGER


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (``--workers`` children included); wait for it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        self.proc.wait(30)


def serve(
    data_dir: Path,
    db_url: str,
    port: int,
    workers: int,
    *extra: str,
    env: dict[str, str] | None = None,
) -> Served:
    """``ledger serve --workers N`` once every process has started (it logs each start)."""
    log = data_dir / f"serve-{time.monotonic_ns()}.log"
    env = {
        **os.environ,
        "LEDGER_DATA_DIR": str(data_dir),
        "LEDGER_DATABASE_URL": db_url,
        "LEDGER_PORT": str(port),
        **(env or {}),
    }
    with log.open("wb") as out:  # a file, not a pipe: a full pipe would stall the server
        proc = subprocess.Popen(
            [*LEDGER, "serve", "--workers", str(workers), *extra],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    served = Served(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 90
    while served.output().count("Application startup complete") < workers:
        if proc.poll() is not None or time.monotonic() > deadline:
            served.stop()
            raise AssertionError(f"ledger serve did not start:\n{served.output()}")
        time.sleep(0.2)
    return served
