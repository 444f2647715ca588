"""README's five-minute tour, run whole against a real vLLM server, as a user would run it.

The plain docs test (``test_docs.py``) runs the blocks that need only a ledger. This one runs
every block of the tour in order, the ``<!-- docs-test: engine -->`` ones included, with three
substitutions a reader makes too: the vLLM server's URL for ``http://127.0.0.1:8000``, the
collector's port for ``8100`` and the model's directory for ``MODEL_DIR``. The server is the
session's strict vLLM CPU pool on the tiny model; the ledger is a fresh SQLite one, started
as the tour's (skipped) first block does. A block fails the test on a non-zero exit or a
traceback. The collector the tour starts in the background is stopped at the end.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.cli import serve
from tests.support.docblocks import ROOT, BlockShells, reader_env, shell_blocks
from tests.support.engine import EngineServer, free_port

pytestmark = pytest.mark.engine
README = ROOT / "README.md"
TOUR = "## A five-minute tour"


def _tour_blocks() -> list[tuple[int, str, bool]]:
    """(line, code, needs the engine) of each block of the tour that is run."""
    text = README.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(text) if line.strip() == TOUR) + 1
    end = next(i for i, line in enumerate(text[start:], start) if line.startswith("## "))
    return [
        (b.line, b.code, b.needs == "engine")
        for b in shell_blocks(README)
        if start < b.line <= end and (b.run or b.needs == "engine")
    ]


def test_the_tour_runs_blocks_that_need_an_engine():
    # What makes this test more than the plain docs test: the collector and evidence steps.
    blocks = _tour_blocks()
    assert sum(engine for _, _, engine in blocks) >= 2, blocks
    assert any("ledger collect" in code for _, code, engine in blocks if engine)
    assert any("ledger replay" in code for _, code, engine in blocks if engine)


def test_the_readme_tour_runs_on_a_real_engine(tiny_engine: EngineServer, tmp_path: Path):
    env = reader_env(tmp_path)
    collector_port = str(free_port())
    proc, url = serve(tmp_path / "ledger-data", {"LEDGER_TOKEN_CACHE_SECONDS": "0"})
    env["LEDGER_API_URL"] = url
    shells = BlockShells(tmp_path, env)
    try:
        for line, code, _ in _tour_blocks():
            code = (
                code.replace("http://127.0.0.1:8000", tiny_engine.url)
                .replace("8100", collector_port)
                .replace("MODEL_DIR", str(tiny_engine.model_dir))
            )
            if "ledger evidence req-1" in code:
                _wait_for_record(url, tmp_path / "reader.token", "req-1")
            shells.run(f"README.md:{line}", code, tmp_path / f"block-{line}.log")
    finally:
        shells.stop()
        proc.terminate()
        proc.wait(timeout=20)


def _wait_for_record(url: str, token_file: Path, request_id: str) -> None:
    """Until the ledger holds ``request_id`` (the collector ships it within a second or so);
    a reader running the tour by hand takes longer than that between two steps."""
    headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/v1/records/{request_id}", headers=headers).status_code == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"the collector did not ship {request_id} within 60 s")
