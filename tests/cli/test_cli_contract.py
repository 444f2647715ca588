"""The CLI's one contract, command by command (README "Commands", docs/ERRORS.md).

Exit 0 when it succeeded, 1 for a negative result, 2 for bad usage or trouble; an error is one
line on stderr that starts with ``error:`` and names what to fix, never a traceback (that
takes ``--debug``); every command and argument has help text.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.main import COMMANDS, load_command, main
from ledger.checkpoint import Checkpoint, sign_checkpoint
from ledger.signing import SigningKey
from tests.support.cli import ledger, serve
from tests.support.harness import Harness

ROOT = Path(__file__).resolve().parents[2]

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
        shown = _help_text(name.split())
        assert "--help" in shown, (name, shown)  # the help as printed, not an empty render
        placeholders += [f"{name}: {m}" for m in re.findall(PLACEHOLDER, shown)]
    assert not missing, f"parameters without help: {missing}"
    assert not placeholders, f"type placeholders shown as metavars: {placeholders}"


# What typer would show where a value is typed but is not one: a flag's <bool>, a repeatable
# option's <list[str]>, a Python class name (<Path>); <path>, <str>, <int> and choices are fine.
PLACEHOLDER = r"<(?:bool|list\[[^>]*\]|[A-Z][A-Za-z]*)>"


def _help_text(path: list[str]) -> str:
    """``ledger PATH --help`` as a terminal shows it (rich's boxes folded to plain text)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([*path, "--help"])
        except SystemExit as done:
            assert done.code in (0, None), path
    return out.getvalue()


def test_the_placeholder_check_sees_what_typer_would_show():
    assert re.findall(PLACEHOLDER, "--json <bool>  --scope <list[str]>  --x <Path>") == [
        "<bool>",
        "<list[str]>",
        "<Path>",
    ]
    assert re.findall(PLACEHOLDER, "--log-key <path>  --limit <int>  --scope <a|b>...") == []
    shown = _help_text(["verify"])
    assert "--trust-bundled-log-key" in shown and "<path>" in shown
    assert "<bool>" not in shown
    assert re.search(r"<records:write \|", _help_text(["tokens", "create"]))
    # choices are spaced: a narrow terminal wraps between them, never inside one
    assert "prompt_mismatch" in _help_text(["records", "search"])


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
        ["erase", "req-1", "--reason", "r", "--api", BAD_URL],
        ["records", "search", "--api", BAD_URL],
        [
            *("fingerprint", "--model-dir", "{tmp}/m", "--register", "--key", "{tmp}/c.pem"),
            *("--api", BAD_URL),
        ],
        ["evidence", "req-1", "-o", "{tmp}/b.json", "--api", DOWN],
        ["keys", "list", "--api", DOWN],
        ["replay", "req-1", "--api", DOWN],
        ["erase", "req-1", "--reason", "r", "--api", DOWN],
        ["records", "search", "--api", DOWN],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_bad_or_unreachable_url_is_one_line_and_exit_2(tmp_path: Path, args: list[str]):
    token = tmp_path / "t.token"
    token.write_text("not-a-real-token\n")
    (tmp_path / "k.pub.pem").write_text("not a key\n")
    (tmp_path / "c.pem").write_bytes(SigningKey.generate().private_pem())
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if args[:2] != ["keys", "show-log"] and args[0] != "diff":  # the two that take no token
        args += ["--token-file", str(token)]
    line = one_error_line(ledger(*args, check=False))
    assert "256.1.1.1" in line or "127.0.0.1:1" in line or "cannot read key" in line


@pytest.mark.parametrize(
    ("url", "why"),
    [("ftp://127.0.0.1:1", "must be http or https"), ("http://u:pw@127.0.0.1:1", "userinfo")],
)
def test_a_ledger_url_that_is_not_http_or_holds_credentials_is_invalid_not_unreachable(
    tmp_path: Path, url: str, why: str
):
    token = tmp_path / "t.token"
    token.write_text("not-a-real-token\n")
    line = one_error_line(
        ledger("records", "search", "--api", url, "--token-file", str(token), check=False)
    )
    assert why in line and "[invalid_url]" in line, line


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "--db", "{pg}"],
        ["tokens", "list", "--db", "{pg}"],
        ["db", "current", "--db", "{pg}"],
        ["db", "upgrade", "--db", "{pg}"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_an_unreachable_database_is_one_line_and_exit_2(args: list[str]):
    # psycopg's message holds a line break (its hint): still one line
    pg = "postgresql://postgres@127.0.0.1:1/ledger"
    line = one_error_line(ledger(*[a.replace("{pg}", pg) for a in args], check=False))
    assert "127.0.0.1" in line and "[storage_error]" in line, line


@pytest.mark.parametrize(
    "args",
    [
        ["fingerprint", "--model-dir", "{tmp}/m", "--register", "--key", "{tmp}/missing.pem"],
        [
            *("collect", "--engine-url", DOWN, "--ledger", DOWN, "--key", "{tmp}/missing.pem"),
            *("--pool", "p", "--worker-id", "w", "--model-dir", "{tmp}/m"),
            *("--token-file", "{tmp}/t"),
        ],
        ["keys", "register", "{tmp}/missing.pem", "--name", "k", "--api", DOWN],
        [  # --api, as every other command names the ledger, is collect's --ledger too
            *("collect", "--engine-url", DOWN, "--api", DOWN, "--key", "{tmp}/missing.pem"),
            *("--pool", "p", "--worker-id", "w", "--model-dir", "{tmp}/m"),
            *("--token-file", "{tmp}/t"),
        ],
    ],
    ids=lambda a: " ".join(a[:4]),
)
def test_a_missing_key_is_named_before_any_work(tmp_path: Path, args: list[str]):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "t").write_text("not-a-real-token\n")
    line = one_error_line(ledger(*[a.replace("{tmp}", str(tmp_path)) for a in args], check=False))
    assert f"cannot read key {tmp_path}/missing.pem" in line, line


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


def _not_a_small_text_file(tmp_path: Path, kind: str) -> Path:
    """A path where a key, token or checkpoint file goes that holds none: read whole, these
    would hang (a FIFO without a writer), never end (``/dev/zero``) or fill memory."""
    path = tmp_path / f"bad-{kind}"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        return Path("/dev/zero")
    elif kind == "too-large":
        path.write_bytes(b"A" * (2 << 20))
    elif kind == "not-utf8":
        path.write_bytes(b"\xff\xfe lgr_x\n")
    return path


_READERS = [
    (["keys", "register", "{bad}", "--name", "k", "--api", DOWN], "key"),
    (["verify", "{tmp}/b.json", "--log-key", "{bad}"], "key"),
    (["audit", "--db", "sqlite:///{tmp}/l.db", "--log-key", "{bad}"], "key"),
    (["audit", "--db", "sqlite:///{tmp}/l.db", "--checkpoint", "{bad}"], "checkpoint"),
    (["keys", "list", "--api", DOWN, "--token-file", "{bad}"], "token file"),
    (["verify", "{bad}", "--trust-bundled-log-key"], "bundle"),
]
_KINDS = ["directory", "fifo", "device", "too-large", "not-utf8"]


@pytest.mark.parametrize(
    ("args", "words", "kind"),
    [
        (args, words, kind)
        for args, words in _READERS
        for kind in _KINDS
        # a bundle may be up to 256 MiB, and verify itself says what its bytes are not
        if not (words == "bundle" and kind in ("too-large", "not-utf8"))
    ],
    ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else a,
)
def test_a_file_that_is_not_a_small_text_file_is_one_line_and_exit_2(
    tmp_path: Path, kind: str, args: list[str], words: str
):
    bad = _not_a_small_text_file(tmp_path, kind)
    (tmp_path / "b.json").write_text("{}")
    args = [a.replace("{bad}", str(bad)).replace("{tmp}", str(tmp_path)) for a in args]
    proc = ledger(*args, check=False, timeout=60)
    line = one_error_line(proc)
    assert str(bad) in line and words in line, line
    assert "this is a bug" not in line, line
    expected = {
        "directory": "not a regular file",
        "fifo": "not a regular file",
        "device": "not a regular file",
        "too-large": "larger than",
        "not-utf8": "not UTF-8" if words not in ("key", "bundle") else "",
    }[kind]
    assert expected in line, line


@pytest.mark.parametrize("bad", ["lgr_abc\x00def", "lgr_abc\ndef", "lgr_\u00e9t\u00e9", "a b"])
def test_a_token_file_that_holds_no_token_says_so(tmp_path: Path, bad: str):
    token = tmp_path / "t.token"
    token.write_text(bad + "\n", "utf-8")
    line = one_error_line(
        ledger("keys", "list", "--api", DOWN, "--token-file", str(token), check=False)
    )
    assert f"token file {token} does not hold a bearer token" in line and "[no_token]" in line


@pytest.mark.parametrize("option", ["--clock-tolerance", "--checkpoint-interval"])
@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e308"])
def test_audit_seconds_must_be_finite_and_not_negative(tmp_path: Path, option: str, value: str):
    proc = ledger("audit", "--db", f"sqlite:///{tmp_path}/l.db", option, value, check=False)
    assert proc.returncode == 2 and option in proc.stderr, proc.stderr
    said = {"inf": "not a finite", "nan": "not a finite", "-1": "negative", "1e308": "31 years"}
    assert said[value] in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "this is a bug" not in proc.stderr


@pytest.mark.parametrize(
    "content", ["", "not a checkpoint\n", '{"checkpoint": "x"}', "[1]"], ids=repr
)
def test_audit_a_checkpoint_file_that_holds_none_is_one_line_and_exit_2(
    tmp_path: Path, content: str
):
    url = f"sqlite:///{tmp_path}/l.db"
    ledger("db", "upgrade", "--db", url)
    bad = tmp_path / "cp.json"
    bad.write_text(content)
    for as_json in ([], ["--json"]):
        proc = ledger("audit", "--db", url, "--checkpoint", str(bad), *as_json, check=False)
        line = one_error_line(proc)
        assert str(bad) in line and "[bad_checkpoint]" in line, line
        assert proc.stdout == "", proc.stdout


def test_audit_writes_nothing_on_stderr_and_never_none(tmp_path: Path):
    url = f"sqlite:///{tmp_path}/l.db"
    ledger("db", "upgrade", "--db", url)
    for as_json in ([], ["--json"]):
        ok = ledger("audit", "--db", url, *as_json)
        assert ok.stderr == "", repr(ok.stderr)
    note = tmp_path / "elsewhere.note"
    note.write_text(sign_checkpoint(Checkpoint("elsewhere", 1, bytes(32)), SigningKey.generate()))
    failed = ledger("audit", "--db", url, "--checkpoint", str(note), check=False)
    assert failed.returncode == 1 and "FAILED" in failed.stdout, failed.stdout
    assert "None" not in failed.stdout and failed.stderr == "", failed.stdout + failed.stderr


def test_a_secret_file_already_there_is_refused_with_its_code(tmp_path: Path):
    ledger("keys", "new", "k", "--dir", str(tmp_path))
    line = one_error_line(ledger("keys", "new", "k", "--dir", str(tmp_path), check=False))
    assert "already exists" in line and line.endswith("[file_exists]"), line
    url = f"sqlite:///{tmp_path}/l.db"
    ledger("db", "upgrade", "--db", url)
    taken = tmp_path / "t.token"
    taken.write_text("keep\n")
    args = ["tokens", "create", "--scope", "admin", "--out", str(taken), "--db", url]
    line = one_error_line(ledger(*args, check=False))
    assert "already exists" in line and line.endswith("[file_exists]"), line


def test_evidence_to_dash_is_refused_before_any_work(tmp_path: Path):
    token = tmp_path / "t.token"
    token.write_text("lgr_x\n")
    args = ["evidence", "req-1", "-o", "-", "--api", DOWN, "--token-file", str(token)]
    for extra in ([], ["--json"], ["--force"]):
        proc = ledger(*args, *extra, check=False)
        line = one_error_line(proc)
        assert "-o - names no file" in line and "-o bundle.json" in line, line
        assert proc.stdout == ""
    assert not (ROOT / "-").exists()


TOKENS = [
    ["tokens", "create", "--scope", "admin"],
    ["tokens", "list"],
    ["tokens", "revoke", "tok_x"],
]


@pytest.mark.parametrize("args", TOKENS, ids=lambda a: a[1])
def test_tokens_never_create_or_migrate_a_ledger(tmp_path: Path, args: list[str]):
    """Every `ledger tokens` command reads an existing ledger at this version's schema, as
    `ledger serve` or `ledger db upgrade` left it; it creates or migrates none."""
    missing = tmp_path / "typo.db"
    line = one_error_line(ledger(*args, "--db", f"sqlite:///{missing}", check=False))
    assert "no ledger database at" in line and "ledger db upgrade" in line, line
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    line = one_error_line(ledger(*args, "--db", f"sqlite:///{empty}", check=False))
    assert "no ledger schema" in line and "ledger db upgrade" in line, line
    old = f"sqlite:///{tmp_path}/old.db"
    ledger("db", "upgrade", "--db", old, "--revision", "0008")
    line = one_error_line(ledger(*args, "--db", old, check=False))
    assert "[schema_outdated]" in line and "ledger db upgrade" in line, line
    assert "0008" in ledger("db", "current", "--db", old).stdout
    default = tmp_path / "fresh"
    default.mkdir()
    line = one_error_line(ledger(*args, env={"LEDGER_DATA_DIR": str(default)}, check=False))
    assert "no ledger database at" in line, line
    assert not list(default.iterdir())


@pytest.mark.parametrize("args", [["db", "current"], ["db", "current", "--json"], TOKENS[1]])
def test_a_database_without_a_ledger_schema_is_exit_2_with_the_right_advice(
    tmp_path: Path, args: list[str]
):
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    line = one_error_line(ledger(*args, "--db", f"sqlite:///{empty}", check=False))
    assert "no ledger schema" in line and "ledger db upgrade" in line, line
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER)")
    line = one_error_line(ledger(*args, "--db", f"sqlite:///{other}", check=False))
    assert "[not_a_ledger_database]" in line and "name an empty database" in line, line


@pytest.mark.postgres
def test_tokens_and_db_current_refuse_an_empty_postgres_database(postgres_databases):
    url = postgres_databases.create()
    for args in (TOKENS[0], ["db", "current"]):
        line = one_error_line(ledger(*args, "--db", url, check=False))
        assert "no ledger schema" in line and "ledger db upgrade" in line, (args, line)


@pytest.mark.parametrize(
    "args",
    [
        ["evidence", "req-1", "-o", "{out}", "--api", DOWN, "--token-file", "{tmp}/t"],
        ["fingerprint", "--model-dir", "{tmp}/m", "--out", "{out}"],
    ],
    ids=lambda a: a[0],
)
def test_an_output_file_already_there_is_kept_unless_force(tmp_path: Path, args: list[str]):
    """`-o` naming a key (or an earlier bundle) by mistake never replaces it."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "t").write_text("lgr_x\n")
    out = tmp_path / "key.pem"
    out.write_text("precious\n")
    args = [a.replace("{out}", str(out)).replace("{tmp}", str(tmp_path)) for a in args]
    line = one_error_line(ledger(*args, check=False))
    assert f"{out} already exists; pass --force to replace it [file_exists]" in line, line
    assert out.read_text() == "precious\n"
    if args[0] == "fingerprint":  # with --force it is replaced, whole
        ledger(*args, "--force", "--json")
        assert json.loads(out.read_text())["fingerprint_id"].startswith("sha256:")


def test_malformed_fingerprint_files_are_one_line_and_exit_2(tmp_path: Path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"schema_version": 1, "model": {"name": "x"}, "engine": {}}))
    cases = {
        "[" * 100_000 + "]" * 100_000: "nested too deeply",
        '{"a":' * 5000 + "1" + "}" * 5000: "nested too deeply",
        '{"schema_version": 1, "engine": {"name": NaN}}': "not_canonicalizable",
        '{"schema_version": 1, "engine": {"n": 123456789012345678901234567890}}': "safe range",
    }
    for n, (text, words) in enumerate(cases.items()):
        bad = tmp_path / f"bad{n}.json"
        bad.write_text(text)
        line = one_error_line(ledger("diff", str(bad), str(good), check=False))
        assert words in line, line


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_what_the_collector_cannot_use_is_refused_before_the_spool_or_the_model(tmp_path: Path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "t").write_text("lgr_x\n")
    (tmp_path / "c.pem").write_bytes(SigningKey.generate().private_pem())
    spool = tmp_path / "spool.sqlite"
    collect = [
        *("collect", "--ledger", DOWN, "--token-file", str(tmp_path / "t")),
        *("--key", str(tmp_path / "c.pem"), "--pool", "p", "--worker-id", "w"),
        *("--spool", str(spool), "--no-register", "--listen", f"127.0.0.1:{_free_port()}"),
    ]
    model = ["--model-dir", str(tmp_path / "m")]
    registers = [a for a in collect if a != "--no-register"]
    cache = {"LEDGER_DIGEST_CACHE": str(tmp_path / "cache" / "digests.sqlite")}
    nothing = one_error_line(
        ledger("fingerprint", "--model-dir", str(tmp_path / "none"), check=False, env=cache)
    )
    assert "[model_dir_missing]" in nothing, nothing
    assert not (tmp_path / "cache").exists()  # no digest cache for a model that is not there
    for args, code in (
        (["fingerprint", *model, "--engine-url", "http://[::1"], "invalid_url"),
        ([*collect, *model, "--engine-url", "http://[::1"], "invalid_url"),
        (
            [*collect, "--model-dir", str(tmp_path / "none"), "--engine-url", DOWN],
            "model_dir_missing",
        ),
        # what the ledger would refuse in every heartbeat is refused before the collector starts
        ([*collect, *model, "--engine-url", DOWN, "--pool", "a b"], "invalid_parameters"),
        ([*collect, *model, "--engine-url", DOWN, "--worker-id", "a/b"], "invalid_parameters"),
        ([*registers, *model, "--engine-url", DOWN, "--advertise-url", "x"], "invalid_url"),
        # the engine away: nothing to fingerprint, so no spool either
        ([*collect, *model, "--engine-url", DOWN], "engine_unreachable"),
    ):
        line = one_error_line(ledger(*args, check=False, env=cache))
        assert f"[{code}]" in line, (args, line)
        flag = next((a for a in ("--pool", "--worker-id", "--advertise-url") if a in line), None)
        assert flag is None or flag == args[-2], line
    assert not list(tmp_path.glob("spool*"))


def test_the_collector_does_not_start_with_a_token_the_ledger_refuses(tmp_path: Path, api: Harness):
    """A token the ledger does not know, or one that may not write records, is named before
    the collector starts (before the engine is asked or the spool made); a good one gets as
    far as the engine (here away)."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "c.pem").write_bytes(SigningKey.generate().private_pem())
    tokens = {
        "unknown": ("lgr_" + "x" * 40, "invalid_token"),
        "reader": (api.token("records:read", "cache:read"), "insufficient_scope"),
        "writer": (api.token("records:write"), "engine_unreachable"),
        "admin": (api.admin_token, "engine_unreachable"),
    }
    for name, (secret, code) in tokens.items():
        (tmp_path / name).write_text(secret + "\n")
        args = [
            *("collect", "--ledger", api.url, "--token-file", str(tmp_path / name)),
            *("--key", str(tmp_path / "c.pem"), "--pool", "p", "--worker-id", "w"),
            *("--spool", str(tmp_path / "spool.sqlite"), "--engine-url", DOWN),
            *("--model-dir", str(tmp_path / "m"), "--listen", f"127.0.0.1:{_free_port()}"),
        ]
        env = {"LEDGER_DIGEST_CACHE": str(tmp_path / "cache" / "digests.sqlite")}
        line = one_error_line(ledger(*args, check=False, env=env))
        assert f"[{code}]" in line, (name, line)
        assert secret not in line
        if code == "insufficient_scope":
            assert "records:write" in line, line
    assert not list(tmp_path.glob("spool*"))


@pytest.mark.parametrize("revision", ["bogus", "-1", "", "base"])
def test_db_upgrade_to_an_unknown_revision_creates_nothing(tmp_path: Path, revision: str):
    url = f"sqlite:///{tmp_path}/new.db"
    line = one_error_line(ledger("db", "upgrade", "--db", url, "--revision", revision, check=False))
    assert "[unknown_revision]" in line, line
    assert not list(tmp_path.iterdir())


def test_a_ledger_of_another_schema_is_named_not_read_or_migrated(tmp_path: Path):
    """An older backup (audit it after `ledger db upgrade`), a database a newer ledger wrote,
    another application's database and a path under a file: one line and exit 2 each, never a
    traceback; nothing is changed."""
    old = f"sqlite:///{tmp_path}/old.db"
    ledger("db", "upgrade", "--db", old, "--revision", "0008")
    line = one_error_line(ledger("audit", "--db", old, "--json", check=False))
    assert "[schema_outdated]" in line and "ledger db upgrade" in line, line
    newer = tmp_path / "newer.db"
    ledger("db", "upgrade", "--db", f"sqlite:///{newer}")
    with sqlite3.connect(newer) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0099'")
    for args in (("db", "upgrade"), ("audit",), ("tokens", "list")):
        line = one_error_line(ledger(*args, "--db", f"sqlite:///{newer}", check=False))
        assert "[schema_too_new]" in line, (args, line)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER)")
    line = one_error_line(ledger("db", "upgrade", "--db", f"sqlite:///{other}", check=False))
    assert "[not_a_ledger_database]" in line, line
    with sqlite3.connect(other) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"customers"}
    (tmp_path / "file").write_text("not a directory")
    under = f"sqlite:///{tmp_path}/file/sub.db"
    line = one_error_line(ledger("db", "upgrade", "--db", under, check=False))
    assert "[invalid_database_url]" in line, line


@pytest.mark.parametrize("name", ["../escaped", "", "a/b", ".", ".hidden", "x\x1b"])
def test_keys_new_refuses_a_name_that_is_a_path(tmp_path: Path, name: str):
    keys = tmp_path / "keys"
    keys.mkdir()
    line = one_error_line(ledger("keys", "new", name, "--dir", str(keys), check=False))
    assert "[invalid_name]" in line, line
    assert not list(tmp_path.rglob("*.pem"))


def test_serve_and_collect_on_a_port_in_use_say_so_and_create_nothing(tmp_path: Path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        data = tmp_path / "data"
        serve_line = one_error_line(
            ledger("serve", "--port", str(port), check=False, env={"LEDGER_DATA_DIR": str(data)})
        )
        assert f"cannot listen on 127.0.0.1:{port}" in serve_line, serve_line
        assert "[cannot_listen]" in serve_line and not data.exists()
        demo_line = one_error_line(
            ledger("demo", "--once", "--port", str(port), "--data-dir", str(data), check=False)
        )
        assert "[cannot_listen]" in demo_line and not data.exists()  # no ledger, key or token
        (tmp_path / "m").mkdir()
        (tmp_path / "t").write_text("lgr_x\n")
        (tmp_path / "c.pem").write_bytes(SigningKey.generate().private_pem())
        collect_line = one_error_line(
            ledger(
                *("collect", "--engine-url", DOWN, "--ledger", DOWN, "--pool", "p"),
                *("--token-file", str(tmp_path / "t"), "--key", str(tmp_path / "c.pem")),
                *("--model-dir", str(tmp_path / "m"), "--spool", str(tmp_path / "s.sqlite")),
                *("--listen", f"127.0.0.1:{port}"),
                check=False,
            )
        )
        assert "[cannot_listen]" in collect_line and not (tmp_path / "s.sqlite").exists()


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
        ["erase", "req-1", "--reason", "r"],
        ["records", "search"],
        ["keys", "revoke", "ed25519:" + "0" * 64, "--reason", "r"],
        ["diff", "sha256:" + "0" * 64, "sha256:" + "1" * 64],
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
        ("keys", "revoke", "../../x", "--reason", "r", *common): "invalid_key_id",
        ("tokens", "revoke", "000000000000", *db): "000000000000",
        ("diff", "sha256:" + "0" * 64, "sha256:" + "1" * 64, *common): "fingerprint_not_found",
        ("erase", "no-such-record", "--reason", "r", *common): "no-such-record",
    }
    for args, words in cases.items():
        line = one_error_line(ledger(*args, check=False))
        assert words in line, line


def test_a_negative_verdict_is_exit_1(tmp_path: Path):
    """`ledger verify` of a bundle that fails a check: exit 1 and the check named (not 2)."""
    example = json.loads((ROOT / "docs" / "examples" / "evidence-example.json").read_text())
    example["leaf_index"] += 1
    bundle = tmp_path / "tampered.json"
    bundle.write_text(json.dumps(example))
    out = ledger("verify", str(bundle), "--trust-bundled-log-key", check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    # the verdict is on stdout, as VALID is: `ledger verify b.json > verdict.txt` keeps either
    assert "INVALID" in out.stdout and "inclusion_proof" in out.stdout, out.stdout
    assert "INVALID" not in out.stderr
    assert "Traceback" not in out.stdout + out.stderr


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
    "args, env, says",
    [
        # an option given is named as given, a variable as set; a validator's words once
        (["serve", "--port", "99999"], {}, "invalid settings: --port: "),
        (["serve"], {"LEDGER_PORT": "abc"}, "invalid settings: LEDGER_PORT: "),
        (
            ["serve"],
            {"LEDGER_WORKER_NETWORKS": "garbage"},
            "invalid settings: LEDGER_WORKER_NETWORKS: worker network 'garbage'",
        ),
    ],
)
def test_an_invalid_setting_names_the_option_or_variable_that_set_it(
    tmp_path: Path, args: list[str], env: dict[str, str], says: str
) -> None:
    data = {"LEDGER_DATA_DIR": str(tmp_path / "data"), **env}
    line = one_error_line(ledger(*args, env=data, check=False))
    assert line.startswith(f"error: {says}"), line
    assert "Value error" not in line and not (tmp_path / "data").exists()


def test_ledger_alone_prints_its_help_and_nothing_on_stderr() -> None:
    proc = ledger(check=False)
    assert proc.returncode == 2 and "Usage: ledger" in proc.stdout and proc.stderr == ""


@pytest.mark.parametrize(
    "args, says",
    [
        (["verify"], "Missing argument 'bundle'. (see 'ledger verify --help')"),
        (["records", "search", "--bogus"], "No such option: --bogus"),
        (["records", "search", "--tier", "7"], "Invalid value for '--tier'"),
        (["nonsense"], "No such command 'nonsense'"),
        (["audit", "--workers", "100000"], "Invalid value for '--workers'"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    line = one_error_line(ledger(*args, check=False))
    assert says in line and "Usage:" not in line


def test_verify_prints_signed_text_without_its_control_characters(monkeypatch) -> None:
    """The checkpoint's origin is text the log signed: printed with its control characters
    shown as escapes, as every signed value is, not sent to the terminal."""
    import dataclasses
    import io

    from rich.console import Console

    from cli import verify as verify_cli
    from ledger.evidence import verify_bundle
    from ledger.signing import load_public_key

    example = json.loads((ROOT / "docs" / "examples" / "evidence-example.json").read_text())
    key = load_public_key((ROOT / "docs" / "examples" / "log-key.pub.pem").read_bytes())
    result = dataclasses.replace(verify_bundle(example, key), origin="log\x1b[2Jx")
    out = io.StringIO()
    monkeypatch.setattr(verify_cli, "console", Console(file=out, width=200))
    verify_cli._print(result)
    assert "\x1b" not in out.getvalue() and "log\\x1b[2Jx" in out.getvalue()


@pytest.mark.parametrize(
    ("value", "printed"),
    [
        ("[bold]x[/]", "[bold]x[/]"),
        ("req:white_check_mark:", "req:white_check_mark:"),
        ("\x1b[31mRED\x07", "\\x1b[31mRED\\x07"),
        ("a\u2028b\u202ec\u200bd", "a\\u2028b\\u202ec\\u200bd"),
        ("x\U000e0041y", "x\\U000e0041y"),
        ("caf\u00e9 \u4e2d", "caf\u00e9 \u4e2d"),
    ],
)
def test_shown_prints_data_as_it_is(value: str, printed: str):
    from cli.common import console, shown

    with console.capture() as captured:
        console.print(shown(value))
    assert captured.get() == printed + "\n"
