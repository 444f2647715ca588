"""``ledger records search`` as a user runs it (a subprocess) against a live ledger: the same
records as the API in table, JSON and CSV, filters passed through, and clear refusals."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger import record_export
from tests.conftest import fresh_url
from tests.support.cli import ledger
from tests.support.documents import record_v2
from tests.support.harness import Harness, start_harness


@pytest.fixture(scope="module")
def api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    harness = start_harness(
        "sqlite", fresh_url(request, "sqlite"), tmp_path_factory.mktemp("records-cli")
    )
    key, fp = harness.setup_collector()
    for pool in ("p1", "p2", "p1"):
        env, disclosures = record_v2(key, fp, pool=pool)
        resp = harness.client().post(
            "/v1/records",
            json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]},
        )
        assert resp.status_code == 201, resp.text
    yield harness
    harness.close()


def _common(api: Harness, tmp_path: Path) -> list[str]:
    token = tmp_path / "reader.token"
    token.write_text(api.token("records:read"))
    return ["--api", api.url, "--token-file", str(token)]


def test_search_prints_what_the_api_answers(api: Harness, tmp_path: Path):
    common = _common(api, tmp_path)
    expected = api.client().get("/v1/records", params={"fields": "meta"}).json()["items"]
    got = json.loads(ledger("records", "search", *common, "--json").stdout)
    assert got == {"items": expected, "count": 3, "next_cursor": None}
    rows = list(csv.reader(io.StringIO(ledger("records", "search", *common, "--csv").stdout)))
    assert rows[0] == list(record_export.COLUMNS)
    assert [r[0] for r in rows[1:]] == [i["request_id"] for i in expected]
    table = ledger("records", "search", *common, env={"COLUMNS": "250"}).stdout
    assert all(i["request_id"] in table for i in expected) and "3 record(s)" in table


def test_filters_order_and_limit_pass_through(api: Harness, tmp_path: Path):
    common = _common(api, tmp_path)
    everything = api.client().get("/v1/records", params={"fields": "meta"}).json()["items"]
    p1 = json.loads(ledger("records", "search", *common, "--pool", "p1", "--json").stdout)
    assert [i["pool"] for i in p1["items"]] == ["p1", "p1"]
    newest = json.loads(
        ledger("records", "search", *common, "--newest", "--limit", "2", "--json").stdout
    )
    assert [i["request_id"] for i in newest["items"]] == [
        i["request_id"] for i in everything[::-1][:2]
    ]
    none = json.loads(
        ledger(
            "records", "search", *common, "--verdict", "bitwise", "--not-aborted", "--json"
        ).stdout
    )
    assert none == {"items": [], "count": 0, "next_cursor": None}


def test_json_says_where_a_search_cut_short_by_limit_continues(api: Harness, tmp_path: Path):
    common = _common(api, tmp_path)
    first = json.loads(ledger("records", "search", *common, "--limit", "2", "--json").stdout)
    page = api.client().get("/v1/records", params={"fields": "meta", "limit": 2}).json()
    assert first["count"] == 2 and first["next_cursor"] == page["next_cursor"] is not None
    rest = (
        api.client()
        .get("/v1/records", params={"fields": "meta", "cursor": first["next_cursor"]})
        .json()
    )
    assert len(rest["items"]) == 1 and rest["next_cursor"] is None


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--verdict", "great"], "'great' is not one of 'bitwise'"),
        (["--content", "gone"], "'gone' is not one of 'complete', 'erased', 'in_log'"),
        (["--csv", "--json"], "choose one of --csv and --json"),
        (["--since", "yesterday"], "RFC 3339"),
    ],
)
def test_bad_filters_are_one_line_and_exit_2(
    api: Harness, tmp_path: Path, args: list[str], shown: str
):
    out = ledger("records", "search", *_common(api, tmp_path), *args, check=False)
    assert out.returncode == 2 and shown in out.stderr and "Traceback" not in out.stderr


def test_the_filter_choices_are_the_apis():
    from cli.records import Content, Verdict
    from ledger.compare import VERDICTS
    from ledger.storage.record_search import CONTENT_STATES, NO_VERDICT

    assert [c.value for c in Content] == list(CONTENT_STATES)
    assert [v.value for v in Verdict] == [*VERDICTS, NO_VERDICT]


def test_record_fields_are_printed_as_they_are_never_as_markup_or_terminal_codes(
    api: Harness, tmp_path: Path
):
    """A record's model is the signer's text: one that is console markup, or carries escape
    sequences, is shown as it is (control characters as \\xNN), and spoils no other row."""
    key, fp = api.setup_collector()
    models = ["oops[/]", "[bold red]markup[/]", "\x1b[31mRED\x1b[0m\x1b]0;TITLE\x07"]
    for model in models:
        env, disclosures = record_v2(key, fp, pool="p-markup", model=model)
        resp = api.client().post(
            "/v1/records",
            json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]},
        )
        assert resp.status_code == 201, resp.text
    out = ledger(
        "records", "search", *_common(api, tmp_path), "--pool", "p-markup",
        env={"COLUMNS": "250"},
    )  # fmt: skip
    assert "oops[/]" in out.stdout and "[bold red]markup[/]" in out.stdout, out.stdout
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert "\\x1b[31mRED\\x1b[0m\\x1b]0;TITLE\\x07" in out.stdout, out.stdout
    assert "3 record(s)" in out.stdout
