"""The docs' other ``<!-- docs-test: engine -->`` blocks, run after README's tour in its world.

A reference page shows commands on a running deployment: a replay, a cache lookup, a
fingerprint, an evidence bundle, an erasure. Each such block is written for a reader who did
README's tour (its ledger, its collector recording pool ``prod-a`` in front of vLLM, its
request ``req-1``), and runs here in that world (``tests/docs/tour.py``), document by document
in the order below, each document's blocks in their order. A block fails the test on a
non-zero exit or a traceback; a few outputs are checked for what the prose says they show.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.tour import README, run_tour
from tests.support.docblocks import ROOT, doc_files, shell_blocks
from tests.support.engine import EngineServer

pytestmark = pytest.mark.engine

# Erasure last: it removes req-1's content, which the others replay and prove.
ORDER = ("FINGERPRINT.md", "REPLAY.md", "CACHE.md", "API.md", "AUDIT.md", "OPERATIONS.md")
# What a block's output shows, by a line of its code.
SHOWS = {
    "ledger diff fp.json": "identical",
    "ledger replay req-1  ": "bitwise",
    "ledger certify --pool prod-a": "invariant",
    '"$LEDGER_API_URL/v1/cache/lookup"': '"hit":true',
    '"$LEDGER_API_URL/v1/replays"': '"verdict":"bitwise"',
    '"$LEDGER_API_URL/v1/cache/$KEY"': "cache_miss",
    "ledger verify evidence.json": "VALID",
    "ledger erase req-1": "erased",
}


def _engine_blocks() -> list[tuple[str, str]]:
    return [
        (block.where, block.code)
        for name in ORDER
        for block in shell_blocks(ROOT / "docs" / name)
        if block.needs == "engine"
    ]


def test_every_document_with_engine_blocks_is_run_in_a_known_order():
    holding = {
        path.name
        for path in doc_files()
        if path != README and any(b.needs == "engine" for b in shell_blocks(path))
    }
    assert holding == set(ORDER)


def test_each_expected_output_names_one_block():
    codes = [code for _, code in _engine_blocks()]
    for line in SHOWS:
        assert sum(line in code for code in codes) == 1, line


def test_the_engine_blocks_run_after_the_tour(tiny_engine: EngineServer, tmp_path: Path):
    with run_tour(tiny_engine, tmp_path) as world:
        for where, code in _engine_blocks():
            output = world.run(where, code)
            for line, shown in SHOWS.items():
                if line in code:
                    assert shown in output, f"{where} should show {shown!r}:\n{output}"
