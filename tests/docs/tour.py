"""README's five-minute tour as a running world, for the tests that run the docs' engine blocks.

:func:`run_tour` starts a fresh SQLite ledger in a directory (as the tour's skipped first block
does), runs every block of the tour there in order, the ``<!-- docs-test: engine -->`` ones
included, against a real vLLM server, and leaves what the tour leaves: the ledger, a collector
on ``127.0.0.1:<port>`` recording pool ``prod-a`` in front of the engine, the request ``req-1``
recorded, and the tour's files (keys, ``worker-1.token``, ``reader.token``,
``log-key.pub.pem``). Other documents' engine blocks then run in the same directory, as a
reader who did the tour runs them.

Blocks are run with the substitutions a reader makes: the vLLM server's URL for
``http://127.0.0.1:8000``, the ledger's for ``http://127.0.0.1:8700``, the collector's port for
``8100`` and the model's directory for ``MODEL_DIR`` and ``models/small``. Before each block,
the collector's spool is left to drain (its ``collector_records_pending`` at 0), as a reader's
pause between two steps lets it: a record a block sent is in the ledger when the next block
asks for it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.cli import serve
from tests.support.docblocks import ROOT, BlockShells, reader_env, shell_blocks
from tests.support.engine import EngineServer, free_port

README = ROOT / "README.md"
TOUR = "## A five-minute tour"
_PENDING = re.compile(r"^collector_records_pending (\S+)$", re.MULTILINE)


def tour_blocks() -> list[tuple[int, str, bool]]:
    """(line, code, needs the engine) of each block of the tour that is run."""
    text = README.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(text) if line.strip() == TOUR) + 1
    end = next(i for i, line in enumerate(text[start:], start) if line.startswith("## "))
    return [
        (b.line, b.code, b.needs == "engine")
        for b in shell_blocks(README)
        if start < b.line <= end and (b.run or b.needs == "engine")
    ]


@dataclass
class World:
    cwd: Path
    url: str  # the ledger's
    engine: EngineServer
    collector_port: str
    shells: BlockShells
    outputs: dict[str, str] = field(default_factory=dict)  # by block, e.g. "README.md:87"

    def run(self, where: str, code: str) -> str:
        """Run one block (after the collector's spool drained); its output."""
        self.settle()
        code = (
            code.replace("http://127.0.0.1:8000", self.engine.url)
            .replace("http://127.0.0.1:8700", self.url)
            .replace("8100", self.collector_port)
            .replace("MODEL_DIR", str(self.engine.model_dir))
            .replace("models/small", str(self.engine.model_dir))
        )
        log = self.cwd / f"block-{where.replace('/', '-').replace(':', '-')}.log"
        self.outputs[where] = self.shells.run(where, code, log)
        return self.outputs[where]

    def settle(self, timeout: float = 60) -> None:
        """Until the collector holds nothing unshipped (nothing to wait for before it runs)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                metrics = httpx.get(f"http://127.0.0.1:{self.collector_port}/metrics").text
            except httpx.TransportError:
                return  # no collector yet
            found = _PENDING.search(metrics)
            if found is not None and float(found.group(1)) == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the collector still holds unshipped records:\n{metrics}")
            time.sleep(0.1)


@contextmanager
def run_tour(engine: EngineServer, cwd: Path) -> Iterator[World]:
    """README's tour, run whole in ``cwd``; what it started is stopped on leaving."""
    env = reader_env(cwd)
    proc, url = serve(cwd / "ledger-data", {"LEDGER_TOKEN_CACHE_SECONDS": "0"})
    env["LEDGER_API_URL"] = url
    world = World(cwd, url, engine, str(free_port()), BlockShells(cwd, env))
    try:
        for line, code, _ in tour_blocks():
            world.run(f"README.md:{line}", code)
        yield world
    finally:
        world.shells.stop()
        proc.terminate()
        proc.wait(timeout=20)
