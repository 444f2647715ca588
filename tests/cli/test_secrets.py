"""Secret files written by the CLI and the server, and production mode's refusals, run as
users run them: ``ledger`` subprocesses in temporary directories (umask 0 where it matters:
nothing may rely on the umask to keep a secret private)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from demo.server_thread import free_port
from ledger.storage import tokenstore
from ledger.storage.database import Database
from tests.support.cli import ledger, serve
from tests.support.databases import PostgresDatabases


@contextmanager
def umask(value: int) -> Iterator[None]:
    """The ledger subprocesses started inside inherit this umask."""
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (files left behind show up here)."""
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def refused(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    """A clear CLI refusal: non-zero exit, a one-line error naming ``words``, no traceback."""
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Traceback" not in out, out
    for word in words:
        assert word in proc.stderr, proc.stderr
    return proc.stderr


# --- `ledger tokens create --out` -------------------------------------------------------------


def test_token_file_is_0600_under_umask_0_and_an_existing_file_is_refused(tmp_path: Path):
    db = ["--db", f"sqlite:///{tmp_path / 'l.db'}"]
    ledger("db", "upgrade", *db)
    out = tmp_path / "reader.token"
    with umask(0):
        made = json.loads(
            ledger(
                "tokens", "create", "--scope", "records:read", "--out", str(out), *db, "--json"
            ).stdout
        )
        assert mode(out) == 0o600 and out.read_text().startswith("lgr_")
        assert "token" not in made  # written, not printed

        # an existing world-readable file is neither overwritten nor made "private" in place
        old = tmp_path / "old.token"
        old.write_text("keep me\n")
        old.chmod(0o644)
        args = ["tokens", "create", "--scope", "admin", "--out", str(old), *db]
        refused(ledger(*args, check=False), str(old), "already exists", "--force")
        assert old.read_text() == "keep me\n" and mode(old) == 0o644
        listed = json.loads(ledger("tokens", "list", *db, "--json").stdout)
        assert [t["token_id"] for t in listed] == [made["token_id"]]  # no token was created

        # --force replaces it: a new file, 0600, holding the new token
        ledger(*args, "--force")
        assert mode(old) == 0o600 and old.read_text().startswith("lgr_")
    assert len(json.loads(ledger("tokens", "list", *db, "--json").stdout)) == 2
    assert tree(tmp_path) == {"l.db", "reader.token", "old.token"}  # no temporary files


@pytest.mark.parametrize("dangling", [False, True])
def test_token_file_symlink_is_refused_and_its_target_untouched(tmp_path: Path, dangling: bool):
    db = ["--db", f"sqlite:///{tmp_path / 'l.db'}"]
    target = tmp_path / "victim"
    if not dangling:
        target.write_text("victim\n")
        target.chmod(0o644)
    link = tmp_path / "t.token"
    link.symlink_to(target)
    ledger("db", "upgrade", *db)
    args = ["tokens", "create", "--scope", "admin", "--out", str(link), *db]
    with umask(0):
        refused(ledger(*args, check=False), "symbolic link")
        assert (
            link.is_symlink() and json.loads(ledger("tokens", "list", *db, "--json").stdout) == []
        )
        ledger(*args, "--force")  # replaces the link itself
    assert not link.is_symlink() and mode(link) == 0o600 and link.read_text().startswith("lgr_")
    if dangling:
        assert not target.exists()
    else:
        assert target.read_text() == "victim\n" and mode(target) == 0o644


def test_force_without_out_is_refused(tmp_path: Path):
    proc = ledger(
        "tokens", "create", "--scope", "admin", "--force", "--db", f"sqlite:///{tmp_path}/l.db",
        check=False,
    )  # fmt: skip
    refused(proc, "--force only applies with --out")


# --- `ledger keys new` --------------------------------------------------------------------------


def test_keys_new_modes_under_umask_0_refusals_and_force(tmp_path: Path):
    keys = tmp_path / "keys"
    with umask(0):
        ledger("keys", "new", "c", "--dir", str(keys))
        assert mode(keys / "c.pem") == 0o600 and mode(keys / "c.pub.pem") == 0o644
        assert mode(keys) == 0o700  # a directory it creates is private too
        # a stale public half: refused before the private key is written
        (keys / "d.pub.pem").write_text("stale\n")
        refused(ledger("keys", "new", "d", "--dir", str(keys), check=False), "already exists")
        assert not (keys / "d.pem").exists()
        # a symlink where the private key goes: refused, the target untouched
        victim = tmp_path / "victim"
        victim.write_text("victim\n")
        victim.chmod(0o644)
        (keys / "e.pem").symlink_to(victim)
        refused(ledger("keys", "new", "e", "--dir", str(keys), check=False), "symbolic link")
        assert not (keys / "e.pub.pem").exists()
        ledger("keys", "new", "e", "--dir", str(keys), "--force")
        assert victim.read_text() == "victim\n" and mode(victim) == 0o644
        assert not (keys / "e.pem").is_symlink() and mode(keys / "e.pem") == 0o600
    assert tree(keys) == {"c.pem", "c.pub.pem", "d.pub.pem", "e.pem", "e.pub.pem"}


# --- `ledger serve`: the first-start secrets ----------------------------------------------------


def test_serve_first_start_secrets_are_private_under_umask_0(tmp_path: Path):
    data = tmp_path / "data"
    with umask(0):
        proc, _ = serve(data, {})
    try:
        assert mode(data / "admin.token") == 0o600 and mode(data / "log-key.pem") == 0o600
        assert mode(data / "log-key.pub.pem") == 0o644
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_refuses_a_stale_admin_token_file_and_creates_no_key(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    stale = data / "admin.token"
    stale.write_text("lgr_from-an-earlier-database\n")
    stale.chmod(0o644)
    proc = ledger(
        "serve", env={"LEDGER_DATA_DIR": str(data), "LEDGER_PORT": str(free_port())}, check=False
    )
    refused(proc, "admin.token", "already exists", "LEDGER_ADMIN_TOKEN_FILE")
    assert stale.read_text() == "lgr_from-an-earlier-database\n" and mode(stale) == 0o644
    assert not (data / "log-key.pem").exists() and not (data / "log-key.pub.pem").exists()
    db = Database(f"sqlite:///{data / 'ledger.db'}")
    assert tokenstore.count_tokens(db) == 0  # the token whose file could not be written is gone
    db.dispose()


def test_serve_never_writes_a_log_key_through_a_symlink(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "log-key.pem").symlink_to(tmp_path / "elsewhere.pem")  # dangling
    proc = ledger(
        "serve", env={"LEDGER_DATA_DIR": str(data), "LEDGER_PORT": str(free_port())}, check=False
    )
    refused(proc, "LEDGER_LOG_KEY_FILE")
    assert not (tmp_path / "elsewhere.pem").exists()


# --- production mode ----------------------------------------------------------------------------


@pytest.fixture
def production(
    tmp_path: Path, postgres_databases: PostgresDatabases
) -> Iterator[tuple[dict[str, str], Database]]:
    """The environment of a production start on a fresh Postgres database holding one admin
    token, with the log key at keys/log-key.pem (not created yet) and a data dir."""
    url = postgres_databases.fresh()
    db = Database(url)
    tokenstore.create_token(db, "operator", ["admin"])
    (tmp_path / "keys").mkdir(mode=0o700)
    env = {
        "LEDGER_ENVIRONMENT": "production",
        "LEDGER_DATABASE_URL": url,
        "LEDGER_LOG_KEY_FILE": str(tmp_path / "keys" / "log-key.pem"),
        "LEDGER_DATA_DIR": str(tmp_path / "data"),
        "LEDGER_PORT": str(free_port()),
    }
    yield env, db
    db.dispose()


def start(env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    """``ledger serve`` that is expected to refuse (it would serve otherwise: bounded)."""
    return ledger("serve", env={**env, **extra}, check=False, timeout=120)


@pytest.mark.postgres
def test_production_refuses_unsafe_settings_before_anything_exists(
    tmp_path: Path, production: tuple[dict[str, str], Database]
):
    env, _ = production
    before = tree(tmp_path)
    for variable, value, words in [
        ("LEDGER_TOKEN_CACHE_SECONDS", "1e9", ["LEDGER_TOKEN_CACHE_SECONDS", "at most 60"]),
        ("LEDGER_TOKEN_CACHE_SECONDS", "inf", ["LEDGER_TOKEN_CACHE_SECONDS", "finite"]),
        ("LEDGER_TOKEN_CACHE_SECONDS", "nan", ["LEDGER_TOKEN_CACHE_SECONDS", "finite"]),
        ("LEDGER_TOKEN_CACHE_SECONDS", "-1", ["LEDGER_TOKEN_CACHE_SECONDS"]),
        ("LEDGER_CHECKPOINT_INTERVAL", "0", ["LEDGER_CHECKPOINT_INTERVAL"]),
        ("LEDGER_WORKER_TTL", "nan", ["LEDGER_WORKER_TTL", "finite"]),
        # past the calendar: every purge failed
        ("LEDGER_CONTENT_RETENTION_DAYS", "3000000", ["LEDGER_CONTENT_RETENTION_DAYS"]),
    ]:
        refused(start(env, **{variable: value}), *words)
        assert tree(tmp_path) == before, (variable, value)


@pytest.mark.postgres
def test_production_without_tokens_leaves_no_key_behind(
    tmp_path: Path, postgres_databases: PostgresDatabases
):
    url = postgres_databases.fresh()  # no token in it
    key = tmp_path / "keys" / "log-key.pem"
    env = {
        "LEDGER_ENVIRONMENT": "production",
        "LEDGER_DATABASE_URL": url,
        "LEDGER_LOG_KEY_FILE": str(key),
        "LEDGER_DATA_DIR": str(tmp_path / "data"),
        "LEDGER_PORT": str(free_port()),
    }
    refused(start(env), "no API tokens exist", "ledger tokens create")
    assert tree(tmp_path) == set()  # no key, no token file, no data dir


@pytest.mark.postgres
def test_production_refuses_a_log_key_others_can_read_or_replace(
    tmp_path: Path, production: tuple[dict[str, str], Database]
):
    env, _ = production
    key = Path(env["LEDGER_LOG_KEY_FILE"])
    ledger("keys", "new", "log-key", "--dir", str(key.parent))
    pem = key.read_bytes()

    def refuses(*words: str) -> None:
        refused(start(env), "LEDGER_LOG_KEY_FILE", *words)
        assert key.read_bytes() == pem and not (tmp_path / "data").exists()

    key.chmod(0o644)
    refuses("0644", "chmod 600")
    key.chmod(0o640)
    refuses("0640")
    # a symlink to a readable key is judged by the file it points to
    key.chmod(0o600)
    real = tmp_path / "real.pem"
    real.write_bytes(pem)
    real.chmod(0o644)
    link_env = {**env, "LEDGER_LOG_KEY_FILE": str(tmp_path / "keys" / "link.pem")}
    (tmp_path / "keys" / "link.pem").symlink_to(real)
    refused(start(link_env), "symbolic link", "0644")
    # a directory others may write to: the key could be swapped
    key.parent.chmod(0o777)
    refuses("writable by group or others")
    key.parent.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(key, 65534, 65534)
        refuses("owned by uid 65534")
        os.chown(key, 0, 0)


@pytest.mark.postgres
def test_production_start_creates_a_private_log_key_and_no_token_file(
    tmp_path: Path, production: tuple[dict[str, str], Database]
):
    env, _ = production
    key = Path(env["LEDGER_LOG_KEY_FILE"])
    with umask(0):
        proc, _ = serve(tmp_path / "data", {k: v for k, v in env.items() if k != "LEDGER_PORT"})
    try:
        assert mode(key) == 0o600 and mode(key.with_suffix(".pub.pem")) == 0o644
        assert not (tmp_path / "data" / "admin.token").exists()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
