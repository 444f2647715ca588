"""Group commit of ingest batches: several checked batches in one transaction, each keeping
its own atomicity, as if they had been appended one after the other."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from ledger.errors import Conflict, InvalidInput, LedgerError, StorageError, VerificationError
from ledger.signing import SigningKey, public_key_pem
from ledger.storage import ingest, keystore, queries
from ledger.storage.audit import audit
from ledger.storage.database import Database
from tests.support.documents import record_envelope, record_item_v2
from tests.support.seed import seed_ledger


@pytest.fixture
def ledger(db: Database):
    seeded = seed_ledger(db, name="c1")
    return db, seeded.log_key, seeded.collector, seeded.fingerprint_id


def _check(db: Database, *batches: list) -> list[ingest.CheckedBatch]:
    return [
        ingest.check_batch(db, [e if isinstance(e, ingest.RecordItem) else e.to_dict() for e in b])
        for b in batches
    ]


def _log(db: Database) -> list[int]:
    with db.read() as s:
        return [r[0] for r in s.execute(text("SELECT idx FROM log_entries ORDER BY idx"))]


def _held(db: Database, request_id: str) -> bool:
    try:
        queries.get_record(db, request_id)
    except LedgerError:
        return False
    return True


def test_batches_written_together_get_the_answers_they_would_get_one_by_one(ledger):
    db, log_key, collector, fp = ledger
    a = [record_envelope(collector, fp) for _ in range(2)]
    b = [record_envelope(collector, fp, seed=s) for s in (1, 2)]
    c = [a[0], record_envelope(collector, fp)]  # repeats a record of the first batch
    outcomes = ingest.write_batches(db, _check(db, a, b, c))
    assert all(isinstance(o, list) for o in outcomes)
    first, second, third = outcomes
    assert [(r.status, r.log_index) for r in first] == [("created", 3), ("created", 4)]
    assert [(r.status, r.log_index) for r in second] == [("created", 5), ("created", 6)]
    # A record appended earlier in the same group is a duplicate, with the index it got.
    assert [(r.status, r.log_index) for r in third] == [("duplicate", 3), ("created", 7)]
    assert _log(db) == list(range(8))
    assert audit(db, log_key.public_key).ok


def test_a_refused_batch_writes_nothing_and_does_not_fail_the_others(ledger):
    db, log_key, collector, fp = ledger
    held = record_envelope(collector, fp, seed=9)
    ingest.ingest_records(db, [held.to_dict()])  # leaf 3
    good1 = [record_envelope(collector, fp)]
    # Held request ID, other content: the whole batch is refused, its new record too.
    clash_id = held.body["request_id"]
    bad = [record_envelope(collector, fp), record_envelope(collector, fp, request_id=clash_id)]
    unknown_fp = [record_envelope(collector, "sha256:" + "0" * 64)]
    good2 = [record_envelope(collector, fp)]
    outcomes = ingest.write_batches(db, _check(db, good1, bad, unknown_fp, good2))
    assert isinstance(outcomes[1], Conflict) and outcomes[1].code == "record_conflict"
    assert outcomes[1].details["item"] == 1 and outcomes[1].details["log_index"] == 3
    assert isinstance(outcomes[2], InvalidInput) and outcomes[2].code == "unknown_fingerprint"
    assert [r.log_index for r in outcomes[0]] == [4]
    assert [r.log_index for r in outcomes[3]] == [5]
    assert not _held(db, bad[0].body["request_id"])
    assert _log(db) == list(range(6))
    assert audit(db, log_key.public_key).ok


def test_one_request_id_with_two_contents_in_one_group_keeps_the_first(ledger):
    db, _, collector, fp = ledger
    rid = "req-raced"
    first = [record_envelope(collector, fp, request_id=rid, seed=1)]
    second = [
        record_envelope(collector, fp, request_id=rid, seed=2),
        record_envelope(collector, fp),
    ]
    ok, refused = ingest.write_batches(db, _check(db, first, second))
    assert [r.status for r in ok] == ["created"]
    assert isinstance(refused, Conflict) and refused.code == "record_conflict"
    assert "log_index" not in refused.details  # not yet committed when it was refused
    assert queries.get_record(db, rid).envelope == first[0].canonical
    assert not _held(db, second[1].body["request_id"])


def test_a_key_revoked_after_its_batch_was_checked_is_refused_alone(ledger):
    db, log_key, collector, fp = ledger
    other = SigningKey.generate()
    keystore.register_key(
        db, log_key, name="c2", role="collector", public_key=public_key_pem(other.public_key)
    )
    mine, theirs = _check(db, [record_envelope(collector, fp)], [record_envelope(other, fp)])
    keystore.revoke_key(db, log_key, other.key_id, "compromised")
    ok, refused = ingest.write_batches(db, [mine, theirs])
    assert [r.status for r in ok] == ["created"]
    assert isinstance(refused, VerificationError) and refused.code == "revoked_key"
    assert refused.details == {"key_id": other.key_id}


def test_a_key_remembered_as_valid_and_revoked_since_signs_nothing_more(ledger):
    db, log_key, collector, fp = ledger
    ingest.ingest_records(db, [record_envelope(collector, fp).to_dict()])  # remembered now
    keystore.revoke_key(db, log_key, collector.key_id, "rotated")
    late = record_envelope(collector, fp)
    with pytest.raises(VerificationError) as err:
        ingest.ingest_records(db, [late.to_dict()])
    assert err.value.code == "revoked_key"
    assert not _held(db, late.body["request_id"])


def test_a_key_unknown_at_first_is_found_once_registered(ledger):
    db, log_key, _, fp = ledger
    newcomer = SigningKey.generate()
    with pytest.raises(VerificationError) as err:
        ingest.ingest_records(db, [record_envelope(newcomer, fp).to_dict()])
    assert err.value.code == "unknown_key"
    keystore.register_key(
        db, log_key, name="new", role="collector", public_key=public_key_pem(newcomer.public_key)
    )
    (result,) = ingest.ingest_records(db, [record_envelope(newcomer, fp).to_dict()])
    assert result.status == "created"


def test_when_the_joint_transaction_fails_each_batch_is_tried_alone(ledger, monkeypatch):
    db, log_key, collector, fp = ledger
    joint = ingest._write
    sizes: list[int] = []

    def fail_when_joint(session, batches):
        sizes.append(len(batches))
        if len(batches) > 1:
            raise StorageError("database error: the connection was lost")
        return joint(session, batches)

    monkeypatch.setattr(ingest, "_write", fail_when_joint)
    checked = _check(db, [record_envelope(collector, fp)], [record_item_v2(collector, fp)])
    outcomes = ingest.write_batches(db, checked)
    assert sizes == [2, 1, 1]
    assert [[r.status for r in o] for o in outcomes] == [["created"], ["created"]]
    assert _log(db) == list(range(5))
    assert audit(db, log_key.public_key).ok


def test_a_lone_batch_the_database_refuses_gets_the_error(ledger, monkeypatch):
    db, _, collector, fp = ledger

    def fail(session, batches):
        raise StorageError("database error: disk full")

    monkeypatch.setattr(ingest, "_write", fail)
    with pytest.raises(StorageError, match="disk full"):
        ingest.ingest_records(db, [record_envelope(collector, fp).to_dict()])
