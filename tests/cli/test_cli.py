"""The `ledger` command, run as users run it: as a subprocess."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

import migrations
from client.ledger_client import LedgerClient
from ledger.signing import SigningKey
from ledger.storage.database import Database
from tests.support.cli import LEDGER, ledger, serve
from tests.support.documents import fingerprint_envelope, record_envelope


def test_keys_new_writes_a_pair_and_never_overwrites(tmp_path: Path):
    out = json.loads(ledger("keys", "new", "c1", "--dir", str(tmp_path), "--json").stdout)
    assert out["key_id"].startswith("ed25519:")
    assert (tmp_path / "c1.pem").stat().st_mode & 0o777 == 0o600
    shown = ledger("keys", "show", str(tmp_path / "c1.pub.pem")).stdout
    assert out["key_id"] in shown
    again = ledger("keys", "new", "c1", "--dir", str(tmp_path), check=False)
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr


def test_db_and_tokens_commands(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    head = migrations.head_revision(Database(url))
    assert f"at revision {head}" in ledger("db", "upgrade", "--db", url).stdout
    assert f"at revision {head}, latest {head}" in ledger("db", "current", "--db", url).stdout
    created = json.loads(
        ledger(
            "tokens", "create", "--scope", "records:read", "--name", "r", "--db", url, "--json"
        ).stdout
    )
    assert created["token"].startswith("lgr_") and created["scopes"] == ["records:read"]
    listed = json.loads(ledger("tokens", "list", "--db", url, "--json").stdout)
    assert [t["token_id"] for t in listed] == [created["token_id"]]
    assert created["token"] not in json.dumps(listed)
    # a name that is console markup is printed as it is, by create and by list
    odd = ledger("tokens", "create", "--scope", "records:read", "--name", "[/x]", "--db", url)
    assert "([/x])" in odd.stdout and "lgr_" in odd.stdout
    assert "[/x]" in ledger("tokens", "list", "--db", url, env={"COLUMNS": "200"}).stdout
    nourl = ledger("audit", "--db", "not a url", check=False)
    assert nourl.returncode == 2 and "not a database URL" in nourl.stderr
    bad_origin = ledger("db", "current", env={"LEDGER_LOG_ORIGIN": "a b"}, check=False)
    assert bad_origin.returncode == 2 and "LEDGER_LOG_ORIGIN" in bad_origin.stderr
    bad = ledger("tokens", "create", "--scope", "root", "--db", url, check=False)
    assert bad.returncode == 2 and "'root' is not one of 'records:write'" in bad.stderr
    ledger("tokens", "revoke", created["token_id"], "--db", url)
    assert json.loads(ledger("tokens", "list", "--db", url, "--json").stdout)[0]["revoked_at"]


def test_read_only_commands_never_create_a_ledger(tmp_path: Path):
    """A mistyped --db is an error that names the fix (exit 2), not a new, empty ledger."""
    missing = tmp_path / "no" / "such" / "l.db"
    typo = tmp_path / "typo.db"
    for args in (
        ("audit", "--db", f"sqlite:///{missing}"),
        ("tokens", "list", "--db", f"sqlite:///{typo}"),
        ("tokens", "revoke", "tok_x", "--db", f"sqlite:///{typo}"),
    ):
        proc = ledger(*args, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "no ledger database at" in proc.stderr and "ledger db upgrade" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "no").exists() and not typo.exists()
    # A database that exists but holds no ledger schema is not migrated behind one's back.
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    proc = ledger("tokens", "list", "--db", f"sqlite:///{empty}", check=False)
    assert proc.returncode == 2 and "no ledger schema" in proc.stderr
    assert migrations.current_revision(Database(f"sqlite:///{empty}")) is None


def test_demo_once(tmp_path: Path):
    proc = ledger("demo", "--once", "--port", "0", "--data-dir", str(tmp_path))
    assert "logprobs bit-exact" in proc.stdout and "signature verified" in proc.stdout
    assert "…" not in proc.stdout  # IDs in full, never cut
    assert re.search(r"sha256:[0-9a-f]{64} \(created\)", proc.stdout), proc.stdout
    assert (tmp_path / "admin.token").read_text().startswith("lgr_")
    # the demo registers its collector key as production should: scoped to its one pool
    with sqlite3.connect(tmp_path / "ledger.db") as conn:
        rows = conn.execute(
            "SELECT envelope FROM log_entries WHERE kind = 'key_registration'"
        ).fetchall()
    bodies = {b["name"]: b for b in (json.loads(row[0])["body"] for row in rows)}
    assert bodies["demo-collector-demo"]["pools"] == ["demo"], bodies
    # a second run on the same data reuses keys and the fingerprint
    again = ledger("demo", "--once", "--port", "0", "--data-dir", str(tmp_path))
    assert "(duplicate)" in again.stdout
    # --json: stdout is one JSON document with the same steps; messages went to stderr
    scripted = ledger("demo", "--once", "--json", "--port", "0", "--data-dir", str(tmp_path))
    report = json.loads(scripted.stdout)
    steps = {row["step"]: row["result"] for row in report["steps"]}
    assert {"signature verified", "logprobs bit-exact"} <= set(steps), steps
    assert steps["collector key registered"].endswith("(signs for pool demo only)"), steps
    assert report["url"].startswith("http://") and report["collectors"] == {}
    assert "ledger API" in scripted.stderr


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_serve_writes_an_admin_token_and_keys_register(tmp_path: Path, backend: str, request):
    env = {}
    if backend == "postgres":
        env["LEDGER_DATABASE_URL"] = request.getfixturevalue("postgres_databases").create()
    proc, url = serve(tmp_path, env)
    try:
        token_file = tmp_path / "admin.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        ledger("keys", "new", "col", "--dir", str(tmp_path))
        common = ["--api", url, "--token-file", str(token_file)]
        reg = json.loads(
            ledger(
                "keys",
                "register",
                str(tmp_path / "col.pub.pem"),
                "--name",
                "col",
                *common,
                "--json",
            ).stdout
        )
        assert reg["role"] == "collector"
        assert reg["pools"] is None
        ledger("keys", "new", "scoped", "--dir", str(tmp_path))
        scoped_pem = str(tmp_path / "scoped.pub.pem")
        scoped = ["keys", "register", scoped_pem, "--name", "scoped", "--pool", "b", "--pool", "a"]
        said = ledger(*scoped, *common).stdout
        assert "(collector, pools a, b)" in said, said
        widened = ledger(*scoped, "--pool", "c", *common, check=False)
        assert widened.returncode != 0 and "key_conflict" in widened.stderr, widened.stderr
        listed = json.loads(ledger("keys", "list", *common, "--json").stdout)
        assert reg["key_id"] in {k["key_id"] for k in listed}
        assert {k["name"]: k["pools"] for k in listed if k["role"] == "collector"} == {
            "col": None,
            "scoped": ["a", "b"],
        }
        table_text = ledger("keys", "list", *common, env={"COLUMNS": "250"}).stdout
        assert "a, b" in table_text and "any" in table_text
        # the compliance path: a record in, its evidence out, verified offline
        col = SigningKey.load(tmp_path / "col.pem")
        with LedgerClient(url, token_file.read_text().strip()) as client:
            fp = client.register_fingerprint(fingerprint_envelope(col))["fingerprint_id"]
            rid = client.post_records([record_envelope(col, fp)])["results"][0]["request_id"]
        bundle = tmp_path / "evidence.json"
        ledger("evidence", rid, "-o", str(bundle), *common)
        checked = ledger("verify", str(bundle), "--log-key", str(tmp_path / "log-key.pub.pem"))
        assert "VALID" in checked.stdout and rid in checked.stdout
        shown = json.loads(ledger("keys", "show-log", "--api", url, "--json").stdout)
        local = json.loads(
            ledger("keys", "show-log", "--json", env={"LEDGER_DATA_DIR": str(tmp_path)}).stdout
        )
        assert shown["key_id"] == local["key_id"] and shown["vkey"] == local["vkey"]
        elsewhere = tmp_path / "elsewhere"  # no ledger data here: only the API can answer
        elsewhere.mkdir()
        by_env = ledger(
            "keys",
            "show-log",
            "--json",
            env={"LEDGER_API_URL": url, "LEDGER_DATA_DIR": str(elsewhere)},
        )
        assert json.loads(by_env.stdout)["vkey"] == local["vkey"]
        missing = ledger(
            "keys", "list", "--api", url, "--token-file", str(tmp_path / "nope"), check=False
        )
        assert missing.returncode == 2 and "cannot read token file" in missing.stderr
        down = ledger(
            "keys",
            "list",
            "--api",
            "http://127.0.0.1:1",
            "--token-file",
            str(token_file),
            check=False,
        )
        assert down.returncode == 2 and "cannot reach the ledger" in down.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_demo_stops_cleanly_on_sigterm(tmp_path: Path):
    """`docker stop` and systemd send SIGTERM: the demo shuts down as on Ctrl-C (with engines,
    that is what stops them; they run in their own sessions)."""
    proc = subprocess.Popen(
        [*LEDGER, "demo", "--port", "0", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("serving on"):
            break
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--ship-linger", "-1", "--ship-linger must be between 0 and 10 seconds"),
        ("--ship-linger", "11", "--ship-linger must be between 0 and 10 seconds"),
        ("--ship-deadline", "0.5", "--ship-deadline must be between 1 and 3600 seconds"),
        ("--ship-deadline", "nan", "--ship-deadline must be between 1 and 3600 seconds"),
        ("--ship-deadline", "3601", "--ship-deadline must be between 1 and 3600 seconds"),
    ],
)
def test_collect_refuses_shipping_times_out_of_range(
    tmp_path: Path, flag: str, value: str, says: str
):
    (tmp_path / "token").write_text("lgr_unused\n")
    result = ledger(
        "collect",
        "--engine-url", "http://127.0.0.1:9",
        "--ledger", "http://127.0.0.1:9",
        "--token-file", str(tmp_path / "token"),
        "--key", str(tmp_path / "missing.pem"),
        "--pool", "p",
        "--model-dir", str(tmp_path),
        flag, value,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert says in result.stderr
