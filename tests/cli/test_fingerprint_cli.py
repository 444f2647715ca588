"""`ledger fingerprint`, `ledger diff` and `ledger fixture-model` on bad input: clear errors."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from collectors.engine import server_info, snapshot_engine
from ledger.errors import Unreachable
from tests.support.cli import ledger
from tests.support.engine import free_port


def test_fixture_model_cli(tmp_path: Path):
    out = json.loads(
        ledger("fixture-model", str(tmp_path / "m"), "--size", "tiny", "--json").stdout
    )
    assert out["size"] == "tiny" and 0 < out["bytes"] < 1_000_000
    bad = ledger("fixture-model", str(tmp_path / "x"), "--size", "huge", check=False)
    shown = " ".join(bad.stderr.replace("│", " ").split())  # click's usage error, boxed
    assert bad.returncode == 2 and "'huge' is not one of 'small', 'tiny'" in shown
    blocked = tmp_path / "file"
    blocked.write_text("x")
    clash = ledger("fixture-model", str(blocked), "--size", "tiny", check=False)
    assert clash.returncode == 2 and "not a directory" in clash.stderr


def test_fingerprint_without_an_engine_says_what_is_unknown(fixture_models, tmp_path: Path):
    out = ledger(
        "fingerprint",
        "--model-dir",
        str(fixture_models["tiny"]),
        "--json",
        "--out",
        str(tmp_path / "fp.json"),
        env={"LEDGER_DIGEST_CACHE": str(tmp_path / "d.sqlite")},
    )
    document = json.loads(out.stdout)
    assert json.loads((tmp_path / "fp.json").read_text()) == document
    engine = document["body"]["engine"]
    assert engine["version"] is None and engine["max_num_seqs"] is None
    assert "no --engine-url" in engine["unknown"]["flags"]
    assert "interpreter is not known" in document["body"]["runtime"]["unknown"]["runtime"]
    assert document["fingerprint_id"].startswith("sha256:")


def test_unreachable_engine_and_missing_model_are_clear_errors(fixture_models, tmp_path: Path):
    env = {"LEDGER_DIGEST_CACHE": str(tmp_path / "d.sqlite")}
    dead = f"http://127.0.0.1:{free_port()}"
    out = ledger(
        "fingerprint",
        "--model-dir",
        str(fixture_models["tiny"]),
        "--engine-url",
        dead,
        env=env,
        check=False,
    )
    assert out.returncode == 2
    assert "does not answer" in out.stderr and "[engine_unreachable]" in out.stderr
    missing = ledger("fingerprint", "--model-dir", str(tmp_path / "nope"), env=env, check=False)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    register = ledger(
        "fingerprint", "--model-dir", str(fixture_models["tiny"]), "--register", check=False
    )
    assert register.returncode == 2 and "--register needs --key" in register.stderr


def test_a_second_run_hashes_nothing(fixture_models, tmp_path: Path):
    env = {"LEDGER_DIGEST_CACHE": str(tmp_path / "d.sqlite")}
    args = ("fingerprint", "--model-dir", str(fixture_models["small"]))
    first = ledger(*args, env=env)
    assert "0 of 7 file digests from the cache" in first.stdout
    second = ledger(*args, env=env)
    assert "hashed 0.0 MB; 7 of 7 file digests from the cache" in second.stdout
    forced = ledger(*args, "--rehash", env=env)
    assert "0 of 7 file digests from the cache" in forced.stdout


def test_diff_refuses_what_is_not_a_fingerprint(tmp_path: Path):
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    out = ledger("diff", str(junk), str(junk), check=False)
    assert out.returncode == 2 and "holds no fingerprint" in out.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert ledger("diff", str(broken), str(junk), check=False).returncode == 2
    neither = ledger("diff", "not-an-id", str(junk), check=False)
    assert neither.returncode == 2 and "neither a file nor a fingerprint ID" in neither.stderr
    unreachable = ledger(
        "diff",
        "sha256:" + "0" * 64,
        str(junk),
        "--api",
        f"http://127.0.0.1:{free_port()}",
        "--token-file",
        str(junk),
        check=False,
    )
    assert unreachable.returncode == 2 and "cannot fetch" in unreachable.stderr


class _ModelsOnly(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that is not vLLM: /v1/models and nothing else."""

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            body = json.dumps({"data": [{"id": "other", "max_model_len": 4096}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        self.send_error(405)

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_that_is_not_vllm(api):
    with pytest.raises(Unreachable, match="without a model list"):
        server_info(api.url)  # the ledger's own API: no /v1/models
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ModelsOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        info = server_info(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert info["model"]["id"] == "other"
    assert info["unknown"] == {
        "version": "/version answered HTTP 404",
        "cache_config": "the server exports no vllm:cache_config_info metric",
        "system_fingerprint": "a one-token completion answered HTTP 405",
    }
    body = snapshot_engine("http://127.0.0.1:1", None, "not inspected", info=info).body
    assert body["max_model_len"] == 4096 and body["version"] is None
    assert body["unknown"]["server.version"] == "/version answered HTTP 404"
