"""A log that holds what a scoped key may not sign is caught by ``ledger audit`` and by
``ledger verify`` (``ledger.key_scope``), on SQLite and Postgres.

The ledger refuses such a record at ingest (tests/api/test_key_scope.py); these logs are
written with that check bypassed, as an older ledger, or a compromised one, would have written
them. The audit re-checks every record against the scope its key's registration leaf holds,
and every replay verdict against the scope of the worker key it names.
"""

from __future__ import annotations

import json

import pytest

from ledger.errors import VerificationError
from ledger.evidence import verify_bundle
from ledger.evidence_format import load_bundle
from ledger.key_scope import out_of_scope, parse_pools, registered_pools
from ledger.signing import SigningKey, public_key_pem
from ledger.storage import checkpoints, ingest, keystore, proofs, verdicts
from ledger.storage.audit import audit
from ledger.storage.database import Database
from tests.support.documents import record_envelope, verdict_body
from tests.support.seed import seed_ledger

ORIGIN = "test/log"


def _scoped(db: Database, log_key: SigningKey, pools: list[str]) -> SigningKey:
    key = SigningKey.generate()
    info, created = keystore.register_key(
        db,
        log_key,
        name="scoped",
        role="collector",
        public_key=public_key_pem(key.public_key),
        pools=pools,
    )
    assert created and info.pools == tuple(sorted(pools))
    return key


def _unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger's ingest check turned off: what a ledger that did not check would log."""
    monkeypatch.setattr(keystore, "out_of_scope", lambda *_: None)


def test_a_record_outside_its_keys_scope_fails_audit_and_verify(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeded = seed_ledger(db)
    key = _scoped(db, seeded.log_key, ["pool-a"])
    inside = record_envelope(key, seeded.fingerprint_id, pool="pool-a")
    ingest.ingest_records(db, [inside.to_dict()])
    checkpoints.sign_if_new(db, seeded.log_key, ORIGIN)
    assert audit(db, seeded.log_key.public_key).ok

    _unchecked(monkeypatch)
    stray = record_envelope(key, seeded.fingerprint_id, pool="pool-b")
    (result,) = ingest.ingest_records(db, [stray.to_dict()])
    checkpoints.sign_if_new(db, seeded.log_key, ORIGIN)
    report = audit(db, seeded.log_key.public_key)
    assert not report.ok
    assert [(f.check, f.index) for f in report.findings] == [("signature", result.log_index)]
    assert "'pool-b'" in report.findings[0].message and "'pool-a'" in report.findings[0].message

    for envelope, valid in ((inside, True), (stray, False)):
        bundle = proofs.evidence(db, seeded.log_key, ORIGIN, envelope.body["request_id"])
        loaded = load_bundle(json.dumps(bundle).encode())
        if valid:
            verify_bundle(loaded, seeded.log_key.public_key)
            continue
        with pytest.raises(VerificationError) as failed:
            verify_bundle(loaded, seeded.log_key.public_key)
        assert failed.value.details["check"] == "collector_key"
        assert "pool-b" in failed.value.message


def test_a_verdict_naming_a_pool_outside_its_worker_keys_scope_fails_audit(db: Database) -> None:
    seeded = seed_ledger(db)
    key = _scoped(db, seeded.log_key, ["pool-a"])
    record = record_envelope(key, seeded.fingerprint_id, pool="pool-a")
    (logged,) = ingest.ingest_records(db, [record.to_dict()])
    ok = verdict_body(record.body, logged.log_index, "bitwise", worker_key_id=key.key_id)
    verdicts.append_verdict(db, seeded.log_key, ok)
    checkpoints.sign_if_new(db, seeded.log_key, ORIGIN)
    assert audit(db, seeded.log_key.public_key).ok

    forged = verdict_body(
        record.body, logged.log_index, "bitwise", worker_key_id=key.key_id, pool="pool-b"
    )
    stored = verdicts.append_verdict(db, seeded.log_key, forged)
    checkpoints.sign_if_new(db, seeded.log_key, ORIGIN)
    report = audit(db, seeded.log_key.public_key)
    assert [(f.check, f.index) for f in report.findings] == [("signature", stored.log_index)]
    assert key.key_id in report.findings[0].message


def test_scope_rules() -> None:
    assert parse_pools(None) is None
    assert parse_pools(["b", "a"]) == ("a", "b")
    assert registered_pools({}) is None
    assert registered_pools({"pools": ["a"]}) == ("a",)
    # a malformed member, never written by the ledger, scopes the key to no pool at all
    assert registered_pools({"pools": "a"}) == ()
    assert registered_pools({"pools": [1]}) == ()
    record = {"pool": "a"}
    assert out_of_scope(None, "inference_record", {"pool": "z"}) is None
    assert out_of_scope(("a",), "inference_record", record) is None
    assert out_of_scope(("a",), "worker_heartbeat", {"pool": "b"}) is not None
    assert out_of_scope((), "inference_record", record) == (
        "inference_record names pool 'a', but its key may sign for no pool"
    )
    assert out_of_scope(("a",), "inference_record", {"pool": ["a"]}) is not None
    assert out_of_scope(("a",), "fingerprint", {}) is None  # fingerprints name no pool
