"""Upgrading a ledger that holds v1 records to the schema with disclosures (revision 0009).

Records ingested at revision 0008 keep verifying and auditing after the upgrade; they are
reported as not erasable; v2 records then join the same log and the audit holds over both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from alembic import command
from sqlalchemy import text

import migrations
from ledger import disclosures
from ledger.errors import Conflict, InvalidInput, VerificationError
from ledger.evidence import verify_bundle
from ledger.evidence_format import load_bundle
from ledger.storage import checkpoints, erasures, ingest, proofs, queries
from ledger.storage.audit import audit
from ledger.storage.database import Database
from ledger.storage.models import Salt
from tests.conftest import BACKENDS
from tests.support.databases import PostgresDatabases, SqliteDatabases
from tests.support.documents import (
    record_envelope,
    record_item_salted,
    record_item_v2,
    salt_in,
)
from tests.support.seed import seed_ledger


@pytest.fixture(params=BACKENDS)
def bare(request: pytest.FixtureRequest) -> Iterator[Database]:
    """An empty database, no schema at all."""
    if request.param == "postgres":
        pg: PostgresDatabases = request.getfixturevalue("postgres_databases")
        url = pg.create()
    else:
        lite: SqliteDatabases = request.getfixturevalue("sqlite_databases")
        url = f"sqlite:///{lite.root / f'bare-{id(request)}.db'}"
    db = Database(url)
    yield db
    db.dispose()


def test_v1_records_verify_and_audit_after_the_upgrade(bare: Database):
    migrations.upgrade(bare, "0008")
    seeded = seed_ledger(bare)
    old = [record_envelope(seeded.collector, seeded.fingerprint_id) for _ in range(5)]
    ingest.ingest_records(bare, [e.to_dict() for e in old])
    checkpoints.sign_if_new(bare, seeded.log_key, "test/log")

    migrations.upgrade(bare)
    assert migrations.current_revision(bare) == migrations.head_revision(bare)
    assert audit(bare, seeded.log_key.public_key).ok
    bundle = proofs.evidence(bare, seeded.log_key, "test/log", old[1].body["request_id"])
    # as the ledger wrote it before (format v2: no disclosures member)
    before = {k: v for k, v in bundle.items() if k != "disclosures"}
    before["format"] = "inference-ledger/evidence/v2"
    for item in (before, bundle):
        verified = verify_bundle(load_bundle(json.dumps(item).encode()), seeded.log_key.public_key)
        assert verified.content.schema_version == 1
    rid = old[2].body["request_id"]
    assert queries.get_record(bare, rid).content == "in_log"
    with pytest.raises(Conflict) as refused:
        erasures.erase(bare, seeded.log_key, rid, reason="x", requested_by="t")
    assert refused.value.code == "not_erasable"

    new = record_item_v2(seeded.collector, seeded.fingerprint_id)
    ingest.ingest_records(bare, [new])
    erasures.erase(
        bare, seeded.log_key, new.envelope["body"]["request_id"], reason="x", requested_by="t"
    )
    checkpoints.sign_if_new(bare, seeded.log_key, "test/log")
    report = audit(bare, seeded.log_key.public_key)
    assert report.ok, report.findings


def test_a_schema_this_version_does_not_know_is_refused_never_migrated(bare: Database):
    """A database written by a newer ledger (a revision this one does not know), a revision
    older than the database's, and a database holding another application's tables are each
    refused with a stable code; nothing is changed."""
    migrations.upgrade(bare)
    head = migrations.head_revision(bare)
    with pytest.raises(InvalidInput) as err:
        migrations.upgrade(bare, "0005")
    assert err.value.code == "no_downgrade"
    assert migrations.current_revision(bare) == head
    with bare.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    for check in (migrations.upgrade, migrations.check_current):
        with pytest.raises(InvalidInput) as err:
            check(bare)
        assert err.value.code == "schema_too_new" and "0099" in err.value.message


def test_an_older_schema_is_named_for_readers_and_another_apps_database_is_not_taken(
    bare: Database,
):
    with bare.engine.begin() as conn:
        conn.execute(text("CREATE TABLE customers (id INTEGER PRIMARY KEY)"))
    with pytest.raises(InvalidInput) as err:
        migrations.upgrade(bare)
    assert err.value.code == "not_a_ledger_database" and "customers" in err.value.message
    with bare.engine.begin() as conn:
        conn.execute(text("DROP TABLE customers"))
    migrations.upgrade(bare, "0008")
    with pytest.raises(InvalidInput) as err:
        migrations.check_current(bare)
    assert err.value.code == "schema_outdated" and "ledger db upgrade" in err.value.message
    migrations.upgrade(bare)
    migrations.check_current(bare)


def test_revisions_0009_and_0010_are_not_undone_while_the_log_depends_on_their_tables(
    bare: Database,
):
    migrations.upgrade(bare)
    seeded = seed_ledger(bare)
    item = record_item_v2(seeded.collector, seeded.fingerprint_id)
    ingest.ingest_records(bare, [item])
    with pytest.raises(Exception, match="0010 cannot be undone: salts"):
        command.downgrade(migrations.alembic_config(bare), "0008")
    # the revisions after 0010 (an index, a column) may be undone before 0010 refuses; its
    # tables are all there
    after = ("0010", "0011", migrations.head_revision(bare))
    assert migrations.current_revision(bare) in after
    migrations.upgrade(bare)
    assert migrations.current_revision(bare) == migrations.head_revision(bare)
    assert audit(bare, seeded.log_key.public_key).ok


def test_revision_0010_keeps_the_salts_of_the_stored_disclosures(
    bare: Database, monkeypatch: pytest.MonkeyPatch
):
    """Upgrading a ledger of v2 records: the salts of the disclosures still stored are known
    (a record reusing one is refused); those of content erased before the upgrade are not."""
    migrations.upgrade(bare, "0009")
    seeded = seed_ledger(bare)
    kept, erased = (record_item_v2(seeded.collector, seeded.fingerprint_id) for _ in range(2))
    with monkeypatch.context() as m:  # ingested as revision 0009's ledger did: no salts row
        write = ingest.insert_rows
        m.setattr(
            ingest,
            "insert_rows",
            lambda s, model, *rows: None if model is Salt else write(s, model, *rows),
        )
        m.setattr(ingest, "_accepted_salts", lambda *_: {})
        ingest.ingest_records(bare, [kept, erased])
    rid = erased.envelope["body"]["request_id"]
    erasures.erase(bare, seeded.log_key, rid, reason="x", requested_by="t")
    migrations.upgrade(bare)
    with bare.engine.connect() as conn:
        held = {bytes(k) for k in conn.execute(text("SELECT salt_key FROM salts")).scalars()}
    assert held == {k for d in kept.disclosures for k in disclosures.salt_keys(salt_in(d))}
    with pytest.raises(VerificationError) as refused:
        ingest.ingest_records(bare, [record_item_salted(seeded, salt_in(kept.disclosures[0]))])
    assert refused.value.code == "invalid_disclosure"
    assert refused.value.details["check"] == "salt"
