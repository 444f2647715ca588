"""README's five-minute tour, run whole against a real vLLM server, as a user would run it.

The plain docs test (``test_docs.py``) runs the blocks that need only a ledger. This one runs
every block of the tour in order, the ``<!-- docs-test: engine -->`` ones included
(``tests/docs/tour.py``: the server is the session's strict vLLM CPU pool on the tiny model;
the ledger a fresh SQLite one). A block fails the test on a non-zero exit or a traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.tour import run_tour, tour_blocks
from tests.support.engine import EngineServer

pytestmark = pytest.mark.engine


def test_the_tour_runs_blocks_that_need_an_engine():
    # What makes this test more than the plain docs test: the collector and evidence steps.
    blocks = tour_blocks()
    assert sum(engine for _, _, engine in blocks) >= 2, blocks
    assert any("ledger collect" in code for _, code, engine in blocks if engine)
    assert any("ledger replay" in code for _, code, engine in blocks if engine)


def test_the_readme_tour_runs_on_a_real_engine(tiny_engine: EngineServer, tmp_path: Path):
    with run_tour(tiny_engine, tmp_path) as world:
        last = world.outputs[f"README.md:{tour_blocks()[-2][0]}"]  # evidence, verify, replay
        assert "VALID" in last and "bitwise" in last, last
