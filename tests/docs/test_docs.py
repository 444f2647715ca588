"""The docs cannot drift: every shell block they mark is run, as a user would run it.

Each document's marked blocks (``tests/support/docblocks.py``) run in order, in one fresh
directory, against a fresh ledger on the embedded SQLite database started there with
``ledger serve``: the cwd holds ``ledger-data/`` (the database, ``admin.token``, the log key)
and a ``.venv`` link to the project's environment, ``ledger`` and ``python`` are on PATH, and
``$LEDGER_API_URL`` is the ledger's URL. A block fails the test on a non-zero exit (bash with
``set -euo pipefail``) or a traceback in its output.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.cli import serve
from tests.support.docblocks import ROOT, doc_files, reader_env, shell_blocks

DOCS = [path for path in doc_files() if any(b.run for b in shell_blocks(path))]


def test_every_shell_block_is_marked_run_or_skipped_with_a_reason():
    unmarked = [b.where for path in doc_files() for b in shell_blocks(path) if not b.marked]
    assert not unmarked, f"shell blocks without a docs-test marker: {unmarked}"
    bare = [
        b.where
        for path in doc_files()
        for b in shell_blocks(path)
        if b.marked and not b.run and not b.needs and not b.skip_reason
    ]
    assert not bare, f"skipped without a reason: {bare}"


def test_the_docs_mark_blocks_to_run():
    # The marker grammar itself: a typo in it would quietly skip every block.
    assert DOCS, "no document marks a block to run"


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_the_marked_blocks_run(tmp_path: Path, doc: Path):
    data = tmp_path / "ledger-data"
    env = reader_env(tmp_path)
    proc, url = serve(data, {"LEDGER_TOKEN_CACHE_SECONDS": "0"})
    env["LEDGER_API_URL"] = url
    try:
        for block in [b for b in shell_blocks(doc) if b.run]:
            done = subprocess.run(
                ["bash", "-c", "set -euo pipefail\n" + block.code],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            output = done.stdout + done.stderr
            assert done.returncode == 0, f"{block.where} exited {done.returncode}:\n{output}"
            assert "Traceback" not in output, f"{block.where} printed a traceback:\n{output}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
