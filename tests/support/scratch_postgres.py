"""A Postgres server of a test's own, started with options on its command line.

The shared server's command line is the operator's; a test about what a command line sets
(``postgres -c search_path=...``) starts a scratch cluster here: ``initdb`` in a temporary
directory (trust authentication, local only), then ``postgres`` on a free port, as the
``postgres`` user when the tests run as root (Postgres refuses to run as root). Skipped
when the server binaries are not installed, except under CI=true.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from fixture_model.engine import free_port


def _bindir() -> Path | None:
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: (p.parts[-3].isdigit(), int(p.parts[-3]) if p.parts[-3].isdigit() else 0),
    )
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@dataclass(frozen=True)
class Scratch:
    url: str  # the superuser's: postgresql://postgres@127.0.0.1:PORT/postgres
    data: Path  # its data directory


@contextmanager
def scratch_postgres(*options: str) -> Iterator[Scratch]:
    """A fresh server started as ``postgres OPTIONS...``; stopped and removed afterwards."""
    bindir = _bindir()
    if bindir is None:
        message = "the PostgreSQL server binaries (initdb) are not installed"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (CI=true: Postgres tests must run)")
        pytest.skip(message)
    root = Path(tempfile.mkdtemp(prefix="ledger-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    subprocess.run(
        _as_server_user(
            [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-N"]
        ),
        check=True,
        capture_output=True,
    )
    port = free_port()
    log = (root / "server.log").open("wb")
    server = subprocess.Popen(
        _as_server_user(
            [
                str(bindir / "postgres"),
                "-D",
                str(data),
                "-p",
                str(port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={root}",
                "-c",
                "fsync=off",
                *options,
            ]
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError as exc:
                if server.poll() is not None or time.monotonic() > deadline:
                    said = (root / "server.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"the scratch Postgres did not start: {said}") from exc
                time.sleep(0.2)
        yield Scratch(url, data)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)
