"""``ledger replay`` and ``ledger certify`` refused by a live ledger (a subprocess against a
ledger with a record and no worker): every refusal is one ``error: … [code]`` line on stderr
and exit 2, with or without ``--json``; ``no_matching_pool`` also shows the nearest pools on
stdout, listed, or with ``--json`` as the API's error object."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_cli_contract import one_error_line
from tests.conftest import fresh_url
from tests.support.cli import ledger
from tests.support.harness import Harness, start_harness
from tests.support.workers import heartbeat, post_heartbeat, register_fingerprint, serial_engine


@pytest.fixture(scope="module")
def api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    harness = start_harness(
        "sqlite", fresh_url(request, "sqlite"), tmp_path_factory.mktemp("replay-cli")
    )
    key, fp = harness.setup_collector()
    assert harness.post([harness.record(key, fp, request_id="req-kept")]).status_code == 201
    yield harness
    harness.close()


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["replay", "req-kept"], "no_matching_pool"),
        (["replay", "nosuch"], "record_not_found"),
        (["replay", "req-kept", "--pool", "support", "--force"], "pool_not_found"),
        (["certify", "--pool", "support"], "pool_not_found"),
    ],
    ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else a,
)
def test_every_refusal_is_one_error_line_on_stderr(
    api: Harness, tmp_path: Path, args: list[str], code: str, json_flag: list[str]
):
    token = tmp_path / "replay.token"
    token.write_text(api.token("replay"))
    proc = ledger(*args, "--api", api.url, "--token-file", str(token), *json_flag, check=False)
    line = one_error_line(proc)
    assert line.endswith(f"[{code}]"), line
    if code == "no_matching_pool" and json_flag:  # its details, for scripts (below)
        assert json.loads(proc.stdout)["error"]["details"]["nearest_pools"] == []
    else:
        assert proc.stdout == "", proc.stdout


@pytest.fixture(scope="module")
def near(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    """A ledger with a record and one live worker, in pool ``near``, that runs another
    fingerprint than the record's."""
    harness = start_harness(
        "sqlite", fresh_url(request, "sqlite"), tmp_path_factory.mktemp("replay-near")
    )
    key, fp = harness.setup_collector()
    assert harness.post([harness.record(key, fp, request_id="req-near")]).status_code == 201
    other = register_fingerprint(harness, key, serial_engine())
    worker = heartbeat(
        key, worker_id="w-near", pool="near", url="http://127.0.0.1:9", fingerprint_id=other
    )
    assert post_heartbeat(harness, worker).status_code == 200
    yield harness
    harness.close()


def test_no_matching_pool_shows_the_nearest_pools_with_and_without_json(
    near: Harness, tmp_path: Path
):
    token = tmp_path / "replay.token"
    token.write_text(near.token("replay"))
    common = ["--api", near.url, "--token-file", str(token)]
    refused = near.client().post("/v1/replays", json={"request_id": "req-near"})
    assert refused.status_code == 409, refused.text
    api_error = refused.json()["error"]
    (pool,) = api_error["details"]["nearest_pools"]
    assert pool["pool"] == "near" and pool["differences"] > 0 and pool["diff"]

    text = ledger("replay", "req-near", *common, check=False)
    assert text.returncode == 2 and one_error_line(text).endswith("[no_matching_pool]")
    assert "nearest pools:" in text.stdout and "pool near (serial)" in text.stdout, text.stdout
    assert pool["diff"][0]["path"] in text.stdout

    as_json = ledger("replay", "req-near", *common, "--json", check=False)
    assert as_json.returncode == 2 and one_error_line(as_json).endswith("[no_matching_pool]")
    error = json.loads(as_json.stdout)["error"]  # one object: code, message, details
    assert error["code"] == "no_matching_pool" and error["details"] == api_error["details"]
    assert error["message"] == f"{api_error['message']} (HTTP 409)"
