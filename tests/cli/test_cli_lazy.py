"""`ledger` imports a sub-command's module only to run it or show its own help; the listing in
`ledger --help` comes from the command table and must say what each command's help says."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest
from typer.core import TyperGroup
from typer.testing import CliRunner

from cli.main import COMMANDS, app, load_command, summary

HEAVY = ("sqlalchemy", "fastapi", "alembic", "api.app", "ledger.storage", "httpx", "torch")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_listed_summary_is_the_commands_own(name: str) -> None:
    command = load_command(name)
    assert command.name == name
    first = " ".join((command.help or "").split("\n\n")[0].split())
    assert summary(name) == first


def test_the_listing_imports_no_command_module() -> None:
    code = (
        "import sys\n"
        "from cli.main import app\n"
        "try:\n"
        "    app(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    for name in COMMANDS:
        assert name in done.stdout


def test_version_and_unknown_commands() -> None:
    runner = CliRunner()
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0
    assert version.stdout.strip() == f"ledger {metadata.version('inference-ledger')}"
    unknown = runner.invoke(app, ["no-such-command"])
    assert unknown.exit_code == 2 and "No such command" in unknown.output


def test_a_group_keeps_its_sub_commands_and_no_shell_completion() -> None:
    keys = load_command("keys")
    assert isinstance(keys, TyperGroup)
    assert {"new", "register", "revoke", "list"} <= set(keys.commands)
    assert not any(p.name == "install_completion" for p in keys.params)
