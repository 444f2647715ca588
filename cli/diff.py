"""``ledger diff A B``: what differs between two fingerprints, and what it means for replay.

A and B are fingerprint IDs held by the ledger, or JSON files: the output of
``ledger fingerprint --json``, a signed fingerprint envelope, the ledger's GET answer, or a bare
body. Exit status as diff(1): 0 same, 1 different, 2 trouble.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from cli.common import (
    ApiOption,
    JsonOption,
    TokenFileOption,
    console,
    fail,
    ledger_errors,
    print_json,
    shown,
    token_file_or_default,
)
from cli.tables import table
from client.ledger_client import LedgerClient, read_token_file
from ledger.errors import LedgerError
from ledger.fingerprint import fingerprint_id
from ledger.fingerprint_diff import Difference, diff
from ledger.small_file import read_small_text

_ID = re.compile(r"^sha256:[0-9a-f]{64}$")


def _body_of(document: Any, source: str) -> dict[str, Any]:
    if isinstance(document, dict):
        if "schema_version" in document:
            return document
        for key in ("body", "envelope"):
            if isinstance(document.get(key), dict):
                return _body_of(document[key], source)
    fail(
        f"{source} holds no fingerprint (expected a body, an envelope or the output of "
        "`ledger fingerprint --json`)",
        2,
    )
    raise AssertionError("unreachable")


def load_fingerprint(ref: str, api: str, token_file: Path | None) -> dict[str, Any]:
    path = Path(ref)
    if path.is_file():
        try:
            return _body_of(
                json.loads(read_small_text(path, "fingerprint file", limit=16 << 20)), ref
            )
        except LedgerError as exc:
            fail(f"{exc.message} [{exc.code}]", 2)
        except json.JSONDecodeError as exc:
            fail(f"cannot read {ref}: {exc}", 2)
        except RecursionError:
            fail(f"cannot read {ref}: its JSON is nested too deeply", 2)
    if not _ID.match(ref):
        fail(f"{ref} is neither a file nor a fingerprint ID (sha256:<64 hex>)", 2)
    try:
        token = read_token_file(token_file_or_default(token_file))
        with LedgerClient(api, token) as client:
            return _body_of(client.get_fingerprint(ref), ref)
    except LedgerError as exc:
        fail(f"cannot fetch {ref} from {api}: {exc.message} [{exc.code}]", 2)
    raise AssertionError("unreachable")


def _show(value: Any) -> str:
    if isinstance(value, dict | list):
        text = json.dumps(value, sort_keys=True)
        return text if len(text) <= 60 else text[:57] + "..."
    return "absent" if value is None else str(value)


def _table(a: str, b: str, changes: list[Difference]) -> Table:
    out = table(
        "field", "change", "replay impact", wrap=["change", "replay impact"], title=f"{a}\n-> {b}"
    )
    ordered = [c for c in changes if not c.derived] + [c for c in changes if c.derived]
    for c in ordered:
        style = "dim" if c.derived else ""
        label = f"{c.path} (derived)" if c.derived else c.path
        change = f"{_show(c.before)} -> {_show(c.after)}"
        out.add_row(shown(label), shown(change), shown(c.impact), style=style)
    return out


def diff_command(
    a: str = typer.Argument(..., help="fingerprint ID in the ledger, or a JSON file"),
    b: str = typer.Argument(..., help="fingerprint ID in the ledger, or a JSON file"),
    api: str = ApiOption,
    token_file: Path | None = TokenFileOption,
    as_json: bool = JsonOption,
) -> None:
    """Print the field-by-field differences between two fingerprints with their replay impact."""
    body_a = load_fingerprint(a, api, token_file)
    body_b = load_fingerprint(b, api, token_file)
    with ledger_errors():  # a body that is JSON but no fingerprint (NaN, a huge number)
        try:
            id_a, id_b = fingerprint_id(body_a), fingerprint_id(body_b)
            changes = diff(body_a, body_b)
        except RecursionError:
            fail("a fingerprint is nested too deeply to be one", 2)
    if as_json:
        print_json({"a": id_a, "b": id_b, "differences": [c.to_json() for c in changes]})
    elif not changes:  # then the IDs are equal: diff compares values as the ID does
        console.print(f"identical: {id_a}")
    else:
        console.print(_table(id_a, id_b, changes))
    if changes:
        raise typer.Exit(1)
