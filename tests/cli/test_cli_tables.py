"""Tables never split a token (cli/tables.py): piped, a table is as wide as its content; on a
terminal too narrow for it, prose and headers wrap between words and an ID stays whole."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from cli.tables import table
from tests.conftest import fresh_url
from tests.support.cli import ledger
from tests.support.documents import record_v2
from tests.support.harness import Harness, start_harness

REQUEST_ID = "0123456789abcdef" * 4  # 64 characters, as a client's hex request IDs are
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    harness = start_harness(
        "sqlite", fresh_url(request, "sqlite"), tmp_path_factory.mktemp("tables-cli")
    )
    key, fp = harness.setup_collector()
    env, disclosures = record_v2(key, fp, request_id=REQUEST_ID)
    resp = harness.client().post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert resp.status_code == 201, resp.text
    yield harness
    harness.close()


# Piped (stdout is a pipe, and COLUMNS says 60; a FORCE_COLOR or TTY_COMPATIBLE that the
# tests' own environment may set would make it a terminal), and on a 60-column terminal.
PIPED = {"COLUMNS": "60", "TTY_COMPATIBLE": "", "FORCE_COLOR": ""}
TERMINAL = {"COLUMNS": "60", "TTY_COMPATIBLE": "1"}


@pytest.mark.parametrize("env", [PIPED, TERMINAL], ids=["piped", "terminal"])
def test_listings_show_every_id_whole_on_one_line(
    api: Harness, tmp_path: Path, env: dict[str, str]
):
    token = tmp_path / "admin.token"
    token.write_text(api.admin_token)
    common = ["--api", api.url, "--token-file", str(token)]
    records = ANSI.sub("", ledger("records", "search", *common, env=env).stdout)
    assert any(REQUEST_ID in line for line in records.splitlines()), records
    keys = ANSI.sub("", ledger("keys", "list", *common, env=env).stdout)
    key_ids = [k["key_id"] for k in api.client().get("/v1/keys").json()["items"]]
    assert key_ids and all(len(k) == 72 for k in key_ids)  # ed25519: and 64 hex digits
    for key_id in key_ids:
        assert any(key_id in line for line in keys.splitlines()), keys


def _render(out: object, width: int, terminal: bool = True) -> list[str]:
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=width, force_terminal=terminal, color_system=None, soft_wrap=True
    )
    console.print(out)
    return buffer.getvalue().splitlines()


def test_on_a_narrow_terminal_prose_and_headers_wrap_between_words():
    digest = "sha256:" + "ab" * 32
    key_id = "ed25519:" + "cd" * 32
    out = table("key ID", "what differs", wrap=["what differs"])
    out.add_row(key_id, f"the leaf's hash is {digest}, the index row's is another one entirely")
    lines = _render(out, 170)
    assert all(len(line) <= 170 for line in lines), lines
    assert sum(digest in line for line in lines) == 1 and sum(key_id in line for line in lines) == 1
    assert len(lines) >= 6  # top, header, rule, the row on two lines at least, bottom
    text = " ".join(" ".join(line.strip("│┃ ").split()) for line in lines)
    assert "the leaf's hash is" in text and "another one entirely" in text
    # Too narrow for the ID and the digest side by side: wider than the terminal, never cut.
    narrow = _render(out, 60)
    assert any(key_id in line for line in narrow) and any(digest in line for line in narrow)


def test_a_table_of_numbers_wraps_its_headers_to_fit_the_terminal():
    out = table("choice", "tokens rec/rep", "first divergence", "logprobs differing", "verdict")
    out.add_row("0", "16/16", "-", "0/16", "bitwise")
    out.add_row("1", "16/12", "3", "5/16", "not_comparable")
    natural = _render(out, 200)
    assert max(map(len, natural)) > 60
    lines = _render(out, 70)
    assert all(len(line) <= 70 for line in lines), lines
    assert any("not_comparable" in line for line in lines)
    piped = _render(out, 70, terminal=False)  # piped: as wide as its content
    assert piped == natural


def test_wrap_names_columns_of_the_table():
    with pytest.raises(ValueError, match="what"):
        table("a", "b", wrap=["what"])


def test_a_table_without_columns_prints_as_rich_prints_it():
    assert _render(table(), 80) == _render(table(), 80, terminal=False)


def test_cells_are_measured_as_the_table_renders_them_markup_read_not_highlighted(monkeypatch):
    """A cell's width is that of what is printed: `[bold]` markup is not counted, and rich's
    highlighter (quadratic on a long run of hex digits) is never run on it."""
    import rich.highlighter

    def refuse(self, text):
        raise AssertionError(f"highlighted: {text.plain[:40]}")

    monkeypatch.setattr(rich.highlighter.ReprHighlighter, "highlight", refuse)
    out = table("name", "note", wrap=["note"])
    out.add_row("[bold]" + "ab" * 40 + "[/bold]", "some words " * 20)
    lines = _render(out, 100)
    assert sum("ab" * 40 in line for line in lines) == 1
    assert all(len(line) <= 100 for line in lines), lines


def test_piped_a_table_is_laid_out_as_rich_lays_it_at_its_natural_width():
    """Each cell is measured once, by the table itself, from its text; piped, the layout is
    rich's own at the table's natural width: markup, emoji codes, wide characters, several
    lines and control characters measured as rich measures them."""
    from rich.table import Table

    rows = [
        ("[bold]0123456789abcdef[/bold]" * 4, "日本語の文字", "a :smile: face"),
        ("2026-12-02T08:05:10Z", "two\nlines", "bell\x07 and\x0bvertical tab"),
        ("", "é accent", "\\[escaped] " * 3),
    ]
    ours = table("request ID", "what", "note", wrap=["note"])
    theirs = Table()
    for header in ("request ID", "what", "note"):
        theirs.add_column(header)
    for row in rows:
        ours.add_row(*row)
        theirs.add_row(*row)
    assert _render(ours, 60, terminal=False) == _render(theirs, 1000, terminal=False)


def test_a_table_that_shows_no_header_is_as_wide_as_its_cells():
    key_id = "ed25519:" + "cd" * 32
    header = "a long header over the prose column"
    out = table("key ID", header, wrap=[header])
    out.show_header = False
    out.add_row(key_id, "whole words only, never split")
    lines = _render(out, 90)
    assert all(len(line) <= 90 for line in lines), lines
    assert any(key_id in line for line in lines), lines
    assert {"whole", "words", "only,", "never", "split"} <= {
        word for line in lines for word in line.strip("│ ").split()
    }, lines
    piped = _render(out, 90, terminal=False)
    assert len(piped[0]) == len(key_id) + len("whole words only, never split") + 7, piped
