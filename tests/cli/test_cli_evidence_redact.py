"""``ledger evidence --redact`` refuses a name no record can hold (exit 2, one line naming
the valid names), run as a user runs it against a live ledger; no bundle is written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_cli_contract import one_error_line
from tests.conftest import fresh_url
from tests.support.cli import ledger
from tests.support.documents import record_v2
from tests.support.harness import Harness, start_harness


@pytest.fixture(scope="module")
def api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    harness = start_harness("sqlite", fresh_url(request, "sqlite"), tmp_path_factory.mktemp("api"))
    yield harness
    harness.close()


@pytest.mark.parametrize("name", ["choices[0].margins", "replay_output", "choices[99999].text"])
def test_a_redact_name_that_matches_nothing_is_refused(api: Harness, tmp_path: Path, name: str):
    key, fp = api.setup_collector()
    env, encoded = record_v2(key, fp)
    item = {"envelope": env.to_dict(), "disclosures": encoded}
    assert api.client().post("/v1/records", json={"records": [item]}).status_code == 201
    token = tmp_path / "reader.token"
    token.write_text(api.token("records:read"))
    out = tmp_path / "bundle.json"
    args = ["evidence", env.body["request_id"], "-o", str(out), "--redact", f"prompt,{name}"]
    bad = ledger(*args, "--api", api.url, "--token-file", str(token), check=False)
    line = one_error_line(bad)
    assert f"cannot redact {name}: " in line, line
    assert "groups (logprobs, output, prompt, text, token_ids)" in line, line
    assert line.endswith("[invalid_parameters]"), line
    assert not out.exists()
