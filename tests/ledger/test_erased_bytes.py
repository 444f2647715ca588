"""An erasure on SQLite leaves no copy of the content in the ledger's files: not in the
database file's free pages (``secure_delete``), not in the write-ahead log's frames (cut after
the erasure). Read as a backup or a disk image would read them: every file, byte for byte."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

import migrations
from ledger.storage import erasures, ingest
from ledger.storage.database import Database
from ledger.storage.queries import RecordFilter
from tests.support.documents import record_item_v2
from tests.support.seed import seed_ledger

PROMPT = "Patient Jane Roe, DOB 1970-01-01, diagnosis zqxjv"


def _files(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))


def _traces(disclosures: list[str]) -> list[bytes]:
    """What a disclosure looks like on disk: as stored, and decoded (its member's value)."""
    out = []
    for d in disclosures:
        out.append(d.encode())
        out.append(base64.urlsafe_b64decode(d + "=" * (-len(d) % 4)))
    return out


@pytest.mark.parametrize("how", ["one", "bulk"])
def test_an_erasure_leaves_no_content_in_the_sqlite_files(tmp_path: Path, how: str):
    path = tmp_path / "ledger.db"
    db = Database(f"sqlite:///{path}")
    try:
        migrations.upgrade(db)
        seeded = seed_ledger(db)
        item = record_item_v2(
            seeded.collector,
            seeded.fingerprint_id,
            text_prompt=True,
            request_extra={"prompt": PROMPT},
        )
        other = record_item_v2(seeded.collector, seeded.fingerprint_id)
        ingest.ingest_records(db, [item, other])
        rid = item.envelope["body"]["request_id"]
        traces = _traces(list(item.disclosures))
        held = _files(path)
        assert PROMPT.encode() in b"".join(traces)
        assert any(t in held for t in traces)  # the content is on disk before
        if how == "one":
            erasures.erase(db, seeded.log_key, rid, reason="subject request", requested_by="t")
        else:
            erasures.erase_matching(
                db,
                seeded.log_key,
                RecordFilter(pool="p1"),
                reason="subject request",
                requested_by="t",
            )
        after = _files(path)
        left = [t[:40] for t in traces if t in after]
        assert not left, f"erased content still in the files: {left}"
        assert PROMPT.encode() not in after
    finally:
        db.dispose()


def test_sqlite_connections_zero_what_they_delete(tmp_path: Path):
    db = Database(f"sqlite:///{tmp_path / 'l.db'}")
    try:
        with db.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA secure_delete").scalar_one() == 1
    finally:
        db.dispose()
