"""The CLI's one contract, command by command (README "Commands", docs/ERRORS.md).

Exit 0 when it succeeded, 1 for a negative result, 2 for bad usage or trouble; an error is one
line on stderr that starts with ``error:`` and names what to fix, never a traceback (that
takes ``--debug``); every command and argument has help text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.main import COMMANDS, load_command, main
from tests.support.cli import ledger, serve

BAD_URL = "http://256.1.1.1:8700"
DOWN = "http://127.0.0.1:1"


def _commands() -> Iterator[tuple[str, Any]]:
    """Every command and sub-command, loaded (Typer's own click: no ``click.Group`` check)."""

    def walk(name: str, command: Any) -> Iterator[tuple[str, Any]]:
        if getattr(command, "commands", None):
            for sub, inner in command.commands.items():
                yield from walk(f"{name} {sub}", inner)
        else:
            yield name, command

    for name in COMMANDS:
        yield from walk(name, load_command(name))


def test_every_command_and_argument_has_help_and_real_placeholders():
    missing, placeholders = [], []
    for name, command in _commands():
        assert (command.help or "").strip(), f"{name} has no help"
        for param in command.params:
            if not (getattr(param, "help", None) or "").strip():
                missing.append(f"{name} {param.name}")
        shown = command.get_help(command.context_class(command, info_name=name))
        placeholders += [f"{name}: {m}" for m in re.findall(r"<[A-Za-z_]+(?:\[[^>]*\])?>", shown)]
    assert not missing, f"parameters without help: {missing}"
    assert not placeholders, f"type placeholders shown as metavars: {placeholders}"


def one_error_line(proc, code: int = 2) -> str:
    where = f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert proc.returncode == code, where
    assert "Traceback" not in proc.stdout + proc.stderr, where
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), where
    return lines[0]


@pytest.fixture(scope="module")
def running(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    data = tmp_path_factory.mktemp("contract")
    proc, url = serve(data, {})
    try:
        yield url, data
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.parametrize(
    "args",
    [
        ["evidence", "req-1", "-o", "{tmp}/b.json", "--api", BAD_URL],
        ["keys", "list", "--api", BAD_URL],
        ["keys", "show-log", "--api", BAD_URL],
        ["keys", "register", "{tmp}/k.pub.pem", "--name", "k", "--api", BAD_URL],
        ["keys", "revoke", "ed25519:00", "--reason", "r", "--api", BAD_URL],
        ["replay", "req-1", "--api", BAD_URL],
        ["certify", "--pool", "p", "--api", BAD_URL],
        ["diff", "sha256:" + "0" * 64, "sha256:" + "1" * 64, "--api", BAD_URL],
        ["evidence", "req-1", "-o", "{tmp}/b.json", "--api", DOWN],
        ["keys", "list", "--api", DOWN],
        ["replay", "req-1", "--api", DOWN],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_bad_or_unreachable_url_is_one_line_and_exit_2(tmp_path: Path, args: list[str]):
    token = tmp_path / "t.token"
    token.write_text("not-a-real-token\n")
    (tmp_path / "k.pub.pem").write_text("not a key\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if args[:2] != ["keys", "show-log"] and args[0] != "diff":  # the two that take no token
        args += ["--token-file", str(token)]
    line = one_error_line(ledger(*args, check=False))
    assert "256.1.1.1" in line or "127.0.0.1:1" in line or "cannot read key" in line


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "{tmp}/missing.json", "--log-key", "{tmp}/missing.pem"],
        ["audit", "--db", "sqlite:///{tmp}/missing.db"],
        ["audit", "--db", "sqlite:///{tmp}/ledger.db", "--checkpoint", "{tmp}/missing.note"],
        ["tokens", "list", "--db", "sqlite:///{tmp}/missing.db"],
        ["diff", "{tmp}/missing-a.json", "{tmp}/missing-b.json"],
        ["keys", "list", "--token-file", "{tmp}/missing.token"],
        ["fingerprint", "--model-dir", "{tmp}/missing-model", "--json"],
        ["db", "current", "--db", "sqlite:///{tmp}/missing.db"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_missing_file_is_one_line_and_exit_2_and_creates_nothing(tmp_path: Path, args: list[str]):
    before = sorted(tmp_path.iterdir())
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    line = one_error_line(ledger(*args, check=False, env={"LEDGER_API_URL": DOWN}))
    assert "missing" in line or "no ledger" in line, line
    assert sorted(tmp_path.iterdir()) == before


def test_a_wrong_token_is_one_line_and_exit_2(running, tmp_path: Path):
    url, _ = running
    token = tmp_path / "wrong.token"
    token.write_text("ilt_0000000000000000000000000000000000000000\n")
    common = ["--api", url, "--token-file", str(token)]
    for args in (
        ["keys", "list"],
        ["evidence", "req-1", "-o", str(tmp_path / "b.json")],
        ["replay", "req-1"],
        ["certify", "--pool", "p"],
    ):
        line = one_error_line(ledger(*args, *common, check=False))
        assert "token" in line, line
    assert not (tmp_path / "b.json").exists()


def test_an_unknown_id_is_one_line_and_exit_2(running, tmp_path: Path):
    url, data = running
    common = ["--api", url, "--token-file", str(data / "admin.token")]
    db = ["--db", f"sqlite:///{data / 'ledger.db'}"]
    cases = {
        ("evidence", "no-such-record", "-o", str(tmp_path / "b.json"), *common): "no-such-record",
        ("evidence", "bad id/../x", "-o", str(tmp_path / "b.json"), *common): "invalid_request_id",
        ("replay", "no-such-record", *common): "no-such-record",
        ("keys", "revoke", "ed25519:" + "0" * 64, "--reason", "r", *common): "key_not_found",
        ("tokens", "revoke", "000000000000", *db): "000000000000",
        ("diff", "sha256:" + "0" * 64, "sha256:" + "1" * 64, *common): "fingerprint_not_found",
    }
    for args, words in cases.items():
        line = one_error_line(ledger(*args, check=False))
        assert words in line, line


def test_version_and_help_of_every_command():
    version = ledger("--version")
    assert version.stdout.startswith("ledger ")
    for name, _ in _commands():
        shown = ledger(*name.split(), "--help")
        assert "Usage: ledger " + name in " ".join(shown.stdout.split()), shown.stdout


def test_an_unexpected_error_is_one_line_unless_debug(monkeypatch, capsys):
    def boom(*args, **kwargs):
        raise RuntimeError("the disk\nis on fire")

    monkeypatch.setattr("cli.main._run", boom)
    with pytest.raises(SystemExit) as stopped:
        main(["keys", "list"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: RuntimeError: the disk is on fire (this is a bug or an unexpected condition; "
        "run again with --debug for the traceback)"
    ]
    with pytest.raises(RuntimeError):
        main(["keys", "--debug", "list"])


def test_json_output_is_json(running):
    url, data = running
    common = ["--api", url, "--token-file", str(data / "admin.token")]
    for args in (["keys", "list", *common], ["keys", "show-log", "--api", url]):
        json.loads(ledger(*args, "--json").stdout)


@pytest.mark.parametrize(
    "args, says",
    [
        (["verify"], "Missing argument 'bundle'. (see 'ledger verify --help')"),
        (["records", "search", "--bogus"], "No such option: --bogus"),
        (["records", "search", "--tier", "7"], "Invalid value for '--tier'"),
        (["nonsense"], "No such command 'nonsense'"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    line = one_error_line(ledger(*args, check=False))
    assert says in line and "Usage:" not in line
