"""SQLite keeps any type in any column and lets its schema be rewritten: edits a superuser
with the database file can make that neither change a value nor any row, yet change what the
routes read. Each is named by the audit now; where a route would have read a legal hold as
absent, it refuses instead (index_mismatch: the ``holds`` rows name a leaf the hold leaves'
index does not find), so hiding a hold from an erasure takes an edit of those rows too.
"""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import func, select

from ledger.storage.audit import audit
from ledger.storage.models import Disclosure
from tests.api.test_erasure_rows import _hold, _mismatch, _post_v2
from tests.api.test_read_paths import superuser
from tests.support.harness import Harness

pytestmark = pytest.mark.parametrize("fresh_api", ["sqlite"], indirect=True)


def _audit_names(api: Harness, *words: str) -> None:
    report = audit(api.db, api.log_key.public_key)
    assert not report.ok
    text = "; ".join(f"{f.check}: {f.message}" for f in report.findings)
    assert all(w in text for w in words), text


AS_TEXT = "envelope = CAST(envelope AS TEXT)"  # the same bytes, stored as text


def _edit_leaf(api: Harness, leaf: int, edit: str) -> None:
    superuser(api, ("log_entries",), (f"UPDATE log_entries SET {edit} WHERE idx = :i", {"i": leaf}))


def _held_record_stays(api: Harness, rid: str) -> None:
    """The erasure of a held record is refused, and its content is all there."""
    erase = api.client(api.token("erasure")).post(
        f"/v1/records/{rid}/erasure", json={"reason": "request"}
    )
    _mismatch(erase)
    _mismatch(api.client(api.token("holds")).get("/v1/holds"))
    with api.db.read() as s:
        kept = s.scalar(select(func.count()).where(Disclosure.request_id == rid))
    assert kept and kept > 0


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        # the same bytes, which the hold reader took for no hold (the erasure answered 201
        # and the content was gone); the audit read them as bytes and passed
        (AS_TEXT, "envelope of row"),
        # the kind as a BLOB: the hold leaves' index no longer finds it
        ("kind = CAST(kind AS BLOB)", "kind of row"),
    ],
)
def test_a_hold_leaf_stored_as_another_type_is_no_lifted_hold(
    fresh_api: Harness, edit: str, named: str
):
    api = fresh_api
    key, fp = api.setup_collector()
    rid = _post_v2(api, key, fp)
    leaf = _hold(api, rid)
    assert audit(api.db, api.log_key.public_key).ok
    _edit_leaf(api, leaf, edit)
    _held_record_stays(api, rid)
    _audit_names(api, named, "stored as")


def test_a_fingerprint_leaf_stored_as_text_is_index_mismatch(fresh_api: Harness):
    api = fresh_api
    _, fp = api.setup_collector()
    leaf = api.client().get(f"/v1/fingerprints/{fp}").json()["log_index"]
    _edit_leaf(api, leaf, AS_TEXT)
    _mismatch(api.client().get(f"/v1/fingerprints/{fp}"))
    _audit_names(api, "envelope of row", "stored as text")


def test_a_record_leaf_stored_as_text_is_index_mismatch_not_a_server_error(fresh_api: Harness):
    api = fresh_api
    key, fp = api.setup_collector()
    rid = _post_v2(api, key, fp)
    leaf = api.client().get(f"/v1/records/{rid}").json()["log_index"]
    _edit_leaf(api, leaf, AS_TEXT)
    _mismatch(api.client().get(f"/v1/records/{rid}"))
    # a search passes over an entry it cannot read as the record its row names (as it does
    # over any edited row), and the audit names it
    assert rid not in api.client().get("/v1/records").text
    _audit_names(api, "envelope of row", "stored as text")


def test_a_key_stored_as_text_is_named_by_the_audit(fresh_api: Harness):
    api = fresh_api
    api.setup_collector()
    superuser(
        api,
        ("signing_keys",),
        ("UPDATE signing_keys SET public_key = CAST(public_key AS TEXT)", {}),
    )
    _audit_names(api, "public_key of row", "stored as text")


@pytest.mark.parametrize(
    ("index", "table", "columns", "where"),
    [
        (
            "ix_log_entries_hold_leaves",
            "log_entries",
            "idx",
            "kind IN ('legal_hold', 'hold_release')",
        ),
        ("ix_records_model_idx", "records", "model, log_index", None),
    ],
)
def test_an_index_rewritten_to_hide_rows_is_named_by_the_audit(
    fresh_api: Harness, index: str, table: str, columns: str, where: str | None
):
    """A partial index re-created without some rows, its SQL then written back as the
    ledger's through writable_schema: every query that uses it misses those rows (a hold, a
    record in a model search), while the audit's full scans see them. PRAGMA integrity_check
    names the index."""
    api = fresh_api
    key, fp = api.setup_collector()
    rid = _post_v2(api, key, fp)
    _hold(api, rid)
    model = api.client().get(f"/v1/records/{rid}").json()["model"]
    assert rid in api.client().get("/v1/records", params={"model": model}).text
    path = api.db.url.removeprefix("sqlite:///")
    with sqlite3.connect(path, isolation_level=None) as conn:
        original = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = ?", (index,)
        ).fetchone()[0]
        hide = f"{where} AND 0" if where else "0"
        conn.execute(f"DROP INDEX {index}")
        conn.execute(f"CREATE INDEX {index} ON {table} ({columns}) WHERE {hide}")
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (original, index))
        conn.execute("PRAGMA writable_schema = OFF")
    if table == "log_entries":  # the hold is hidden from its index, not from its row
        _held_record_stays(api, rid)
    else:
        assert rid not in api.client().get("/v1/records", params={"model": model}).text
    _audit_names(api, "integrity_check", index)
