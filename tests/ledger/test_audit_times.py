"""A receive time moved back across an idle stretch of the log.

Checkpoints bound each leaf's receive time from both sides, but the log signs one only when it
has grown: after an idle hour, the last checkpoint before a new leaf is an hour old, and a
database superuser could date the leaf anywhere in that hour (past a legal hold's ``since``,
or into a retention cutoff) without leaving the checkpoints' bounds. What the leaf's signed
body says it was made at closes that: a record is received no earlier than a minute before
its request started (by its collector's clock), an erasure no earlier than the log made it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from ledger.clock import parse_rfc3339, rfc3339
from ledger.record_v2 import commit_record
from ledger.records import RECORD_KIND
from ledger.signing import sign_envelope
from ledger.storage import checkpoints, erasures, ingest
from ledger.storage.audit import audit
from ledger.storage.database import Database, as_utc
from ledger.storage.ingest import RecordItem
from ledger.storage.models import LogEntry
from tests.conftest import BACKENDS, fresh_url
from tests.support.audited_ledger import ORIGIN
from tests.support.documents import record_body
from tests.support.seed import seed_ledger
from tests.support.superuser import Superuser


class Clock:
    """The ledger's clock, set by the test (three hours ago at first), a microsecond later at
    every reading."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC) - timedelta(hours=3)

    def advance(self, delta: timedelta) -> None:
        self.now += delta


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()

    class Set(datetime):
        @classmethod
        def now(cls, tz: object = None) -> datetime:  # type: ignore[override]
            clock.now += timedelta(microseconds=1)  # it ticks: no two readings are equal
            return clock.now

    for module in ("ledger.storage.database", "ledger.clock"):
        monkeypatch.setattr(f"{module}.datetime", Set)
    monkeypatch.setattr("ledger.storage.database._latest", datetime(1970, 1, 1, tzinfo=UTC))
    return clock


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield fresh_url(request, request.param)


TABLE = {"record": "records", "erasure": "erasures", "hold": "holds"}
COLUMN = {"record": "received_at", "erasure": "created_at", "hold": "created_at"}


@pytest.mark.parametrize("which", ["record", "erasure", "hold"])
def test_a_receive_time_moved_back_across_an_idle_hour_is_named(
    url: str, clock: Clock, which: str
) -> None:
    db = Database(url)
    try:
        seeded = seed_ledger(db)
        log_key = seeded.log_key
        checkpoints.sign_if_new(db, log_key, ORIGIN)
        clock.advance(timedelta(hours=2))  # the log sits idle
        body = record_body(seeded.fingerprint_id, request_id="req-late")
        body["timings"]["started_at"] = rfc3339(clock.now)  # by the collector's clock
        committed, disclosures = commit_record(body)
        item = RecordItem(
            sign_envelope(RECORD_KIND, committed, seeded.collector).to_dict(), disclosures
        )
        (result,) = ingest.ingest_records(db, [item])
        erased = erasures.erase(db, log_key, "req-late", reason="asked", requested_by="t")
        hold = erasures.place_hold(
            db, log_key, request_id="req-other", filter=None, reason="case 7", placed_by="t"
        )
        checkpoints.sign_if_new(db, log_key, ORIGIN)
        assert audit(db, log_key.public_key).ok
        # the erasure's signed time is its leaf's, to the microsecond
        with db.read() as s:
            row = s.get(LogEntry, erased.log_index)
            assert row is not None
            body = json.loads(row.envelope)["body"]
            assert parse_rfc3339(body["erased_at"]) == as_utc(row.appended_at)
        leaf = {"record": result.log_index, "erasure": erased.log_index}.get(
            which, hold["log_index"]
        )
        su = Superuser(url)
        back = su.time(clock.now - timedelta(hours=1))
        su.execute(
            [
                ("UPDATE log_entries SET appended_at = %s WHERE idx = %s", (back, leaf)),
                (
                    f"UPDATE {TABLE[which]} SET {COLUMN[which]} = %s WHERE log_index = %s",
                    (back, leaf),
                ),
            ],
            ["log_entries", TABLE[which]],
        )
        report = audit(db, log_key.public_key)
        found = [(f.check, f.index, f.table, f.column) for f in report.findings]
        assert found == [("time", leaf, "log_entries", "appended_at")], found
        assert "before" in report.findings[0].message
    finally:
        db.dispose()
