"""``ledger replay`` and ``ledger certify`` refused by a live ledger (a subprocess against a
ledger with a record and no worker): every refusal is one ``error: … [code]`` line on stderr
and exit 2, with or without ``--json``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_cli_contract import one_error_line
from tests.conftest import fresh_url
from tests.support.cli import ledger
from tests.support.harness import Harness, start_harness


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
    assert proc.stdout == "", proc.stdout
