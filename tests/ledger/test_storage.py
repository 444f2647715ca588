"""Storage on both backends: migrations, the append sequence, append-only enforcement."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select, text

import migrations
from ledger.errors import Conflict, InvalidInput, NotFound, VerificationError
from ledger.merkle import leaf_hash
from ledger.signing import SigningKey
from ledger.storage import checkpoints, erasures, ingest, keystore, log, queries, verdicts
from ledger.storage.audit import audit
from ledger.storage.bulk import insert_rows
from ledger.storage.database import Database
from ledger.storage.models import APPEND_ONLY_TABLES, ERASABLE_TABLES, CacheKey
from tests.support.documents import record_envelope, record_item_v2
from tests.support.seed import seed_ledger


@pytest.fixture
def ledger(db: Database):
    seeded = seed_ledger(db, name="c1")
    return db, seeded.log_key, seeded.collector, seeded.fingerprint_id


def test_migrations_reach_head_and_are_idempotent(db):
    assert migrations.current_revision(db) == migrations.head_revision(db)
    migrations.upgrade(db)  # a second run is a no-op
    assert migrations.current_revision(db) == migrations.head_revision(db)


def test_every_accepted_envelope_is_a_leaf_in_commit_order(ledger):
    db, _, collector, fp = ledger
    envs = [record_envelope(collector, fp) for _ in range(5)]
    results = ingest.ingest_records(db, [e.to_dict() for e in envs])
    assert [r.log_index for r in results] == [3, 4, 5, 6, 7]  # 0 log key, 1 c1, 2 fingerprint
    with db.read() as s:
        rows = s.execute(
            text("SELECT idx, kind, envelope, leaf_hash FROM log_entries ORDER BY idx")
        ).all()
    assert [r.idx for r in rows] == list(range(8))
    assert [r.kind for r in rows[:3]] == ["key_registration", "key_registration", "fingerprint"]
    for row, env in zip(rows[3:], envs, strict=True):
        assert bytes(row.envelope) == env.canonical
        assert bytes(row.leaf_hash) == leaf_hash(env.canonical)


def test_concurrent_writers_never_fork_the_sequence(ledger):
    db, _, collector, fp = ledger
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for _ in range(5):
                batch = [record_envelope(collector, fp).to_dict() for _ in range(3)]
                ingest.ingest_records(db, batch)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with db.read() as s:
        idx = [r[0] for r in s.execute(text("SELECT idx FROM log_entries ORDER BY idx"))]
        n_records = s.execute(text("SELECT count(*) FROM records")).scalar_one()
    assert idx == list(range(len(idx)))
    assert n_records == 60 and len(idx) == 63


@pytest.mark.parametrize("table", APPEND_ONLY_TABLES)
def test_raw_sql_update_and_delete_are_refused(ledger, table):
    db, _, collector, fp = ledger
    env = record_envelope(collector, fp)
    ingest.ingest_records(db, [env.to_dict()])  # indexes its cache keys too
    request_id = env.body["request_id"]
    verdicts.append_verdict(
        db,
        ledger[1],
        {
            "replay_id": "rpl-1",
            "request_id": request_id,
            "verdict": "bitwise",
            "pool": "p",
            "worker_id": "w",
        },
    )
    verdicts.append_certificate(
        db,
        ledger[1],
        {"certificate_id": "cert-1", "pool": "p", "fingerprint_id": fp, "invariant_observed": True},
    )
    item = record_item_v2(collector, fp)
    ingest.ingest_records(db, [item])
    erasures.erase(
        db, ledger[1], item.envelope["body"]["request_id"], reason="test", requested_by="t"
    )
    hold = erasures.place_hold(
        db, ledger[1], request_id=request_id, filter=None, reason="test", placed_by="t"
    )
    erasures.release_hold(db, ledger[1], hold["hold_id"], reason="test", released_by="t")
    checkpoints.sign_if_new(db, ledger[1], "test/log")
    column = {
        "log_entries": "kind",
        "records": "model",
        "signing_keys": "name",
        "key_revocations": "reason",
        "fingerprints": "key_id",
        "merkle_nodes": "hash",
        "checkpoints": "note",
        "replays": "verdict",
        "certificates": "pool",
        "erasures": "reason_code",
        "holds": "request_id",
        "hold_releases": "log_index",
        "salts": "log_index",
    }[table]
    if table == "key_revocations":
        keystore.revoke_key(db, ledger[1], collector.key_id, "test")
    for statement in (f"UPDATE {table} SET {column} = {column}", f"DELETE FROM {table}"):
        with pytest.raises(Exception, match="append-only"), db.engine.begin() as conn:
            conn.execute(text(statement))
    with db.engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() > 0


@pytest.mark.parametrize("table", ERASABLE_TABLES)
def test_content_rows_are_deleted_only_after_a_logged_erasure(ledger, table):
    db, log_key, collector, fp = ledger
    item = record_item_v2(collector, fp, tier=1, request_extra={"temperature": 0})
    ingest.ingest_records(db, [item])
    rid = item.envelope["body"]["request_id"]
    where = f"FROM {table} WHERE request_id = '{rid}'"
    with db.engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) {where}")).scalar_one() > 0
    column = "digest" if table == "disclosures" else "tier"
    for statement in (f"UPDATE {table} SET {column} = {column}", f"DELETE {where}"):
        with pytest.raises(Exception, match="refused"), db.engine.begin() as conn:
            conn.execute(text(statement))
    erasures.erase(db, log_key, rid, reason="data subject request", requested_by="t")
    with db.engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) {where}")).scalar_one() == 0
    # rows of another record stay guarded
    other = record_item_v2(collector, fp, tier=1, request_extra={"temperature": 0})
    ingest.ingest_records(db, [other])
    with pytest.raises(Exception, match="refused"), db.engine.begin() as conn:
        conn.execute(text(f"DELETE FROM {table}"))


@pytest.mark.postgres
def test_postgres_refuses_truncate_even_in_replica_mode(request):
    pg = request.getfixturevalue("postgres_databases")
    db = Database(pg.fresh())
    keystore.ensure_log_key(db, SigningKey.generate())
    try:
        for table in APPEND_ONLY_TABLES:
            with pytest.raises(Exception, match="append-only"), db.engine.begin() as conn:
                conn.execute(text("SET session_replication_role = replica"))
                conn.execute(text(f"TRUNCATE {table} CASCADE"))
        with pytest.raises(Exception, match="append-only"), db.engine.begin() as conn:
            conn.execute(text("SET session_replication_role = replica"))
            conn.execute(text("UPDATE log_entries SET kind = 'forged'"))
    finally:
        db.dispose()


def test_duplicates_and_conflicts(ledger):
    db, _, collector, fp = ledger
    env = record_envelope(collector, fp, request_id="req-dup", seed=1)
    first = ingest.ingest_records(db, [env.to_dict()])
    again = ingest.ingest_records(db, [env.to_dict()])
    assert first[0].status == "created" and again[0].status == "duplicate"
    assert again[0].log_index == first[0].log_index
    other = record_envelope(collector, fp, request_id="req-dup", seed=2)
    with pytest.raises(Conflict) as err:
        ingest.ingest_records(db, [other.to_dict()])
    assert err.value.details["request_id"] == "req-dup"
    assert err.value.details["held_content_hash"] == first[0].content_hash


def test_batches_are_atomic(ledger):
    db, _, collector, fp = ledger
    good = record_envelope(collector, fp)
    bad = record_envelope(collector, fp).to_dict()
    bad["body"]["tier"] = 1 - bad["body"]["tier"]  # signature no longer matches
    with pytest.raises(VerificationError) as err:
        ingest.ingest_records(db, [good.to_dict(), bad])
    assert err.value.details["item"] == 1
    with pytest.raises(NotFound):
        queries.get_record(db, good.body["request_id"])


def test_revoked_and_unknown_keys_are_refused(ledger):
    db, log_key, collector, fp = ledger
    stranger = SigningKey.generate()
    with pytest.raises(VerificationError) as err:
        ingest.ingest_records(db, [record_envelope(stranger, fp).to_dict()])
    assert err.value.code == "unknown_key"
    keystore.revoke_key(db, log_key, collector.key_id, "rotated")
    with pytest.raises(VerificationError) as err:
        ingest.ingest_records(db, [record_envelope(collector, fp).to_dict()])
    assert err.value.code == "revoked_key"


def test_a_revocation_between_verification_and_append_wins(ledger, monkeypatch):
    db, log_key, collector, fp = ledger
    record = record_envelope(collector, fp)
    original = keystore.load_keys
    revoked: list[str] = []

    def load_then_revoke(session, key_ids):
        keys = original(session, key_ids)  # the signature is checked against these
        if not revoked:
            revoked.append(collector.key_id)
            keystore.revoke_key(db, log_key, collector.key_id, "compromised")
        return keys

    monkeypatch.setattr(keystore, "load_keys", load_then_revoke)
    with pytest.raises(VerificationError) as err:
        ingest.ingest_records(db, [record.to_dict()])
    assert err.value.code == "revoked_key"
    assert "read again when the batch was appended" in err.value.message
    assert err.value.details == {"key_id": collector.key_id}
    with pytest.raises(NotFound):
        queries.get_record(db, record.body["request_id"])


def test_unknown_fingerprint_is_refused(ledger):
    db, _, collector, _ = ledger
    with pytest.raises(InvalidInput) as err:
        ingest.ingest_records(db, [record_envelope(collector, "sha256:" + "0" * 64).to_dict()])
    assert err.value.code == "unknown_fingerprint"


def test_a_log_never_changes_its_key(db):
    first = SigningKey.generate()
    assert keystore.ensure_log_key(db, first).key_id == first.key_id
    assert keystore.ensure_log_key(db, first).log_index == 0  # idempotent
    with pytest.raises(Conflict) as err:
        keystore.ensure_log_key(db, SigningKey.generate())
    assert err.value.code == "log_key_mismatch" and first.key_id in err.value.message


CACHE_COLUMNS = ("cache_key", "request_id", "log_index", "tier", "deterministic")


def test_bulk_inserts_round_trip_and_a_refused_row_keeps_nothing(db):
    rows = [(f"ck1:sha256:{i:064x}", f"req-{i}", i, i % 3, bool(i % 2)) for i in range(50)]
    with db.write() as s:
        insert_rows(s, CacheKey, CACHE_COLUMNS, rows)
    with db.read() as s:
        back = s.execute(
            select(*(getattr(CacheKey, c) for c in CACHE_COLUMNS)).order_by(CacheKey.log_index)
        ).all()
    assert [tuple(r) for r in back] == rows
    # a batch holding one row that breaks a constraint is refused whole, as a 409
    with pytest.raises(Conflict) as err, db.write() as s:
        insert_rows(s, CacheKey, CACHE_COLUMNS, [("ck1:new", "req-new", 99, 0, True), rows[0]])
    assert err.value.code == "rejected_by_database"
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(CacheKey)).scalar() == 50
    if db.is_postgres:  # SQLite does not enforce varchar lengths
        with pytest.raises(InvalidInput) as bad, db.write() as s:
            insert_rows(s, CacheKey, CACHE_COLUMNS, [("x" * 81, "req-long", 100, 0, True)])
        assert bad.value.code == "rejected_by_database"
        # the session is usable again after a refused COPY
        with db.write() as s:
            insert_rows(s, CacheKey, CACHE_COLUMNS, [("ck1:after", "req-after", 101, 1, False)])
        with db.read() as s:
            assert s.execute(select(func.count()).select_from(CacheKey)).scalar() == 51


def test_postgres_stores_envelopes_without_a_compression_attempt(request):
    """Migration 0005: envelopes (mostly base64) are stored out of line, uncompressed."""
    db = Database(request.getfixturevalue("postgres_databases").fresh())
    try:
        with db.read() as s:
            storage = s.execute(
                text(
                    "SELECT attstorage FROM pg_attribute "
                    "WHERE attrelid = 'log_entries'::regclass AND attname = 'envelope'"
                )
            ).scalar()
        assert storage == "e"  # EXTERNAL
    finally:
        db.dispose()


def test_a_chunked_audit_rebuilds_every_checkpoint(ledger, monkeypatch):
    """Checkpoints at sizes inside and at the edges of the audit's chunks, on both backends."""
    db, log_key, collector, fp = ledger
    for size in (1, 6, 2, 9, 4):
        ingest.ingest_records(db, [record_envelope(collector, fp).to_dict() for _ in range(size)])
        checkpoints.sign_if_new(db, log_key, "test/log")
    for chunk in (1, 3, 7, 2000):
        monkeypatch.setattr("ledger.storage.audit.CHUNK", chunk)
        for signatures in (True, False):
            report = audit(db, log_key.public_key, signatures=signatures)
            assert report.ok, [f.to_dict() for f in report.findings]
            assert (report.leaves, report.checkpoints) == (25, 5)


def test_a_hold_on_a_name_no_record_can_have_logs_nothing(ledger):
    """The API checked a hold's request ID, the core did not: a caller of the library could
    sign a NUL, a path or 10 KB into the log as the ID a hold covers."""
    db, log_key, _, _ = ledger

    def size() -> int:
        with db.read() as s:
            return log.log_size(s)

    before = size()
    for request_id in ("a\x00b", "../x", "..", "x" * 201, "a b"):
        with pytest.raises(InvalidInput) as err:
            erasures.place_hold(
                db, log_key, request_id=request_id, filter=None, reason="r", placed_by="t"
            )
        assert err.value.code == "invalid_parameters"
    assert size() == before
    erasures.place_hold(db, log_key, request_id="req-ok", filter=None, reason="r", placed_by="t")
    assert size() == before + 1


@pytest.mark.parametrize(
    "url",
    [
        "mysql://x@y/z",
        "postgresql+psycopg2://u@h/db",
        "oracle://u@h/db",
        "sqlite+pysqlcipher:///x",
        "foo://x",
        "Postgresql://u@h/db",
    ],
)
def test_a_database_the_ledger_does_not_run_on_is_named_as_such(url: str):
    """A scheme SQLAlchemy knows but the ledger does not run on was a storage_error naming a
    missing Python module."""
    with pytest.raises(InvalidInput) as err:
        Database(url)
    assert err.value.code == "invalid_database_url"
    assert "SQLite" in err.value.message and "Postgres" in err.value.message
