"""``ledger erase``, ``ledger evidence --redact`` and what ``ledger verify`` says of content,
run as a user runs them (subprocesses) against a live ledger."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.signing import public_key_pem
from tests.cli.test_cli_contract import one_error_line
from tests.conftest import fresh_url
from tests.support.cli import ledger
from tests.support.documents import record_v2
from tests.support.harness import Harness, start_harness


@pytest.fixture
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = start_harness("sqlite", fresh_url(request, "sqlite"), tmp_path / "api")
    yield harness
    harness.close()


def _post(api: Harness, pool: str = "p1") -> str:
    key, fp = api.setup_collector()
    env, disclosures = record_v2(key, fp, pool=pool)
    resp = api.client().post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert resp.status_code == 201, resp.text
    rid: str = env.body["request_id"]
    return rid


def test_erase_redact_and_verify_from_the_command_line(api: Harness, tmp_path: Path):
    token = tmp_path / "officer.token"
    token.write_text(api.token("erasure", "records:read"))
    common = ["--api", api.url, "--token-file", str(token)]
    log_key = tmp_path / "log.pub.pem"
    log_key.write_text(public_key_pem(api.log_key.public_key))
    rid, other, kept = _post(api), _post(api), _post(api, pool="p2")

    redacted = tmp_path / "redacted.json"
    out = ledger("evidence", rid, "-o", str(redacted), "--redact", "prompt,text", *common, "--json")
    assert json.loads(out.stdout)["disclosures"] == 2  # token IDs and logprobs of the output
    shown = ledger("verify", str(redacted), "--log-key", str(log_key), env={"COLUMNS": "200"})
    assert "redacted in this bundle" in shown.stdout and "choices[0].token_ids" in shown.stdout
    bad = ledger(
        "evidence", rid, "-o", str(tmp_path / "x.json"), "--redact", "secrets", *common, check=False
    )
    assert bad.returncode == 2 and "cannot redact secrets:" in bad.stderr

    erased = ledger("erase", rid, "--reason", "GDPR Art. 17 request", *common)
    assert "content erased" in erased.stdout
    again = json.loads(ledger("erase", rid, "--reason", "again", *common, "--json").stdout)
    assert again["status"] == "already_erased"
    after = tmp_path / "after.json"
    ledger("evidence", rid, "-o", str(after), *common)
    verified = json.loads(ledger("verify", str(after), "--log-key", str(log_key), "--json").stdout)
    assert {c["status"] for c in verified["content"]} == {"erased"}
    assert verified["erasure"]["reason"] == "GDPR Art. 17 request"
    # the bundle exported before the erasure still verifies
    assert ledger("verify", str(redacted), "--log-key", str(log_key)).returncode == 0

    dry = ledger(
        "erase", "--pool", "p1", "--reason", "offboarding", *common, env={"COLUMNS": "200"}
    )
    assert other in dry.stdout and "would be erased" in dry.stdout and kept not in dry.stdout
    assert api.client().get(f"/v1/records/{other}").json()["content"] == "complete"
    done = json.loads(
        ledger(
            "erase", "--pool", "p1", "--reason", "offboarding", "--yes", *common, "--json"
        ).stdout
    )
    assert done["erased"] == [other] and not done["dry_run"]
    assert api.client().get(f"/v1/records/{kept}").json()["content"] == "complete"

    neither = ledger("erase", "--reason", "x", *common, check=False)
    assert neither.returncode == 2 and "give either a REQUEST_ID" in neither.stderr
    reader = tmp_path / "reader.token"
    reader.write_text(api.token("records:read"))
    refused = ledger(
        "erase", kept, "--reason", "x", "--api", api.url, "--token-file", str(reader), check=False
    )
    assert refused.returncode == 2 and "insufficient_scope" in refused.stderr


def test_unknown_redact_names_are_named_plainly(api: Harness, tmp_path: Path):
    token = tmp_path / "reader.token"
    token.write_text(api.token("records:read"))
    rid = _post(api)
    out = tmp_path / "x.json"
    args = ["evidence", rid, "-o", str(out), "--redact", "bogus,text,nope"]
    bad = ledger(*args, "--api", api.url, "--token-file", str(token), check=False)
    line = one_error_line(bad)
    assert "cannot redact bogus, nope: " in line, line
    assert "groups (logprobs, output, prompt, text, token_ids)" in line, line
    assert "[" not in line.removesuffix("[invalid_parameters]").replace("choices[N]", ""), line
    assert not out.exists()
