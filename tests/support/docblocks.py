"""The shell blocks of the project's Markdown docs, and how each is marked for the docs test.

Every fenced ``sh`` (or ``bash``) block in README.md and docs/*.md is preceded by a marker line:

- ``<!-- docs-test -->``: ``tests/docs/test_docs.py`` runs the block;
- ``<!-- docs-test: engine -->``: run against a real vLLM server, in README's tour
  (``tests/docs/test_readme_tour.py``) or, in other documents, after that tour in its world
  (``tests/docs/test_engine_docs.py``);
- ``<!-- docs-test: postgres -->``: ``tests/docs/test_postgres_roles.py`` runs it as a Postgres
  superuser (only OPERATIONS.md's roles use it);
- ``<!-- docs-test: skip REASON -->``: it does not, and the reason says why (an engine, a GPU,
  Docker or Postgres roles it cannot have), so an unrun command is a decision, never an
  oversight.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGUAGES = {"sh", "bash", "shell"}
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^`\s]*)")
# README's first lines are its two commands, so no marker can precede them; `make test` is this
# suite and `make demo` is run by tests/demo/test_demo_engine.py.
README_OPENING = "the two make targets: the suite itself, and test_demo_engine.py"
_MARK = re.compile(
    r"^<!--\s*docs-test(?::\s*(?:(?P<needs>engine|postgres)|skip\b\s*(?P<reason>.*?)))?\s*-->\s*$"
)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    marked: bool
    run: bool  # by the plain docs test
    needs: str  # "engine" or "postgres": run by that block's own test instead ("" when none)
    skip_reason: str  # for a skipped block: why ("" when the marker gives no reason)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def shell_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    pos = 0
    while pos < len(lines):
        opened = _FENCE.match(lines[pos])
        if opened is None:
            pos += 1
            continue
        fence, start = opened["fence"], pos
        end = start + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if opened["info"].lower() in SHELL_LANGUAGES:
            before = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
            mark = _MARK.match(before.strip())
            if mark is None and path.name == "README.md" and start == 0:
                mark = _MARK.match(f"<!-- docs-test: skip {README_OPENING} -->")
            blocks.append(
                Block(
                    path=path,
                    line=start + 1,
                    code="\n".join(lines[start + 1 : end]) + "\n",
                    marked=mark is not None,
                    run=mark is not None and mark["reason"] is None and not mark["needs"],
                    needs="" if mark is None else mark["needs"] or "",
                    skip_reason="" if mark is None else (mark["reason"] or "").strip(),
                )
            )
        pos = end + 1
    return blocks


def reader_env(cwd: Path) -> dict[str, str]:
    """The environment a reader's shell has in ``cwd``: the project's ``ledger`` and ``python``
    on PATH, a ``.venv`` link to its environment there, HOME there, and no ``LEDGER_*``
    setting of the suite's own."""
    venv_bin = Path(sys.executable).parent
    (cwd / ".venv").symlink_to(venv_bin.parent, target_is_directory=True)
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")},
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(cwd),
    }


class BlockShells:
    """Runs blocks as a reader would, in ``cwd`` with ``env``: bash with ``set -euo pipefail``,
    each block in a session of its own, so that what a block leaves running (a server started
    with ``&``) runs on until :meth:`stop`, and with its output in a file, which such a
    process keeps open."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env
        self._leaders: list[int] = []

    def run(self, where: str, code: str, log: Path, timeout: float = 300) -> str:
        """The block's output, once it exited 0 without a traceback (else AssertionError)."""
        with log.open("w") as out:
            shell = subprocess.Popen(
                ["bash", "-c", "set -euo pipefail\n" + code],
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            self._leaders.append(shell.pid)
            try:
                returncode: int | None = shell.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                returncode = None  # e.g. waiting for a server that never came up
        output = log.read_text()
        ended = f"ran over {timeout:g} s" if returncode is None else f"exited {returncode}"
        assert returncode == 0, f"{where} {ended}:\n{output}"
        assert "Traceback" not in output, f"{where} printed a traceback:\n{output}"
        return output

    def stop(self) -> None:
        """Stop what every block left running."""
        for leader in self._leaders:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, signal.SIGTERM)
