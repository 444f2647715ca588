"""Write routes act on index rows only as their leaves say, on SQLite and Postgres.

A row inserted beside the log (as the app's own database role, triggers enabled, or as a
superuser who deletes it again afterwards) must never make a route sign something false or
skip what it should log: an erasure names only digests the record and its replay verdicts
commit to, a key is answered "revoked" only by its logged revocation, only a hold some leaf
placed is released, and a record or fingerprint sent again is a duplicate only of its leaf.
Each refusal is 500 ``index_mismatch`` with nothing logged, and the audit names the row; a
release of a hold no leaf placed fails the audit.
"""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, insert, select

from ledger import disclosures
from ledger.canonical import canonicalize, sha256_digest
from ledger.erasure import RELEASE_KIND, release_body
from ledger.fingerprint import fingerprint_id
from ledger.signing import sign_envelope
from ledger.storage import erasures, log
from ledger.storage.audit import audit
from ledger.storage.database import utcnow
from ledger.storage.models import (
    Disclosure,
    Fingerprint,
    Hold,
    KeyRevocation,
    LogEntry,
    Record,
)
from ledger.storage.models import SigningKey as SigningKeyRow
from tests.support.documents import fingerprint_envelope, record_v2
from tests.support.harness import Harness
from tests.support.superuser import Superuser


@pytest.fixture
def api(fresh_api: Harness) -> Harness:
    """A fresh ledger per test (tests/conftest.py)."""
    return fresh_api


def _post_v2(api: Harness) -> tuple[str, int, list[str]]:
    key, fp = api.setup_collector()
    env, disclosures = record_v2(key, fp, tier=1)
    resp = api.client().post(
        "/v1/records",
        json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]},
    )
    assert resp.status_code == 201, resp.text
    return env.body["request_id"], resp.json()["results"][0]["log_index"], disclosures


def _log_size(api: Harness) -> int:
    with api.db.read() as s:
        return int(s.execute(select(func.count()).select_from(LogEntry)).scalar_one())


def _mismatch(answer: httpx.Response) -> dict:
    assert answer.status_code == 500, answer.text
    error: dict = answer.json()["error"]
    assert error["code"] == "index_mismatch", answer.text
    return error


def _findings(api: Harness) -> list:
    return audit(api.db, api.log_key.public_key).findings


def test_an_inserted_disclosure_row_is_never_named_in_a_signed_erasure(api: Harness):
    """A well-formed disclosure of something the record never committed to, stored under its
    request ID at another leaf (where reading the record does not look): the erasure, which
    deletes the record's content by request ID, would have signed its digest as erased."""
    rid, _, committed = _post_v2(api)
    bogus = disclosures.make("request", {"prompt": "never recorded"})
    with api.db.write() as s:
        s.execute(
            insert(Disclosure),
            [
                {
                    "request_id": rid,
                    "digest": bogus.digest,
                    "log_index": 0,
                    "disclosure": bogus.encoded,
                }
            ],
        )
    size = _log_size(api)
    error = _mismatch(
        api.client(api.token("erasure")).post(f"/v1/records/{rid}/erasure", json={"reason": "dsr"})
    )
    assert error["details"] == {"log_index": 0, "request_id": rid}, error
    assert _log_size(api) == size  # no erasure event, nothing deleted
    with api.db.read() as s:
        held = s.scalar(select(func.count()).where(Disclosure.request_id == rid))
    assert held == len(committed) + 1  # the record's own and the inserted row, all still there
    assert any(f.table == "disclosures" for f in _findings(api))


def test_an_honest_erasure_names_exactly_the_records_digests(api: Harness):
    rid, _, disclosures = _post_v2(api)
    erased = api.client(api.token("erasure")).post(
        f"/v1/records/{rid}/erasure", json={"reason": "dsr"}
    )
    assert erased.status_code == 201, erased.text
    assert erased.json()["erased_digests"] == len(disclosures)
    assert _findings(api) == []


def test_an_inserted_revocation_row_is_not_answered_as_the_keys_revocation(api: Harness):
    key, _ = api.setup_collector()
    with api.db.write() as s:
        s.execute(
            insert(KeyRevocation),
            [{"key_id": key.key_id, "reason": "forged", "log_index": 0, "revoked_at": utcnow()}],
        )
    size = _log_size(api)
    error = _mismatch(
        api.client().post(f"/v1/keys/{key.key_id}/revoke", json={"reason": "stolen laptop"})
    )
    assert error["details"] == {"log_index": 0, "key_id": key.key_id}
    assert _log_size(api) == size
    assert any(f.table == "key_revocations" for f in _findings(api))


def test_a_logged_revocation_is_answered_again_unchanged(api: Harness):
    key, _ = api.setup_collector()
    first = api.client().post(f"/v1/keys/{key.key_id}/revoke", json={"reason": "stolen"})
    assert first.status_code == 200, first.text
    size = _log_size(api)
    again = api.client().post(f"/v1/keys/{key.key_id}/revoke", json={"reason": "stolen"})
    assert again.status_code == 200 and again.json()["revoked_at"] == first.json()["revoked_at"]
    assert _log_size(api) == size


def test_only_a_hold_some_leaf_placed_is_released(api: Harness):
    rid, index, _ = _post_v2(api)
    hold_id = "hold-" + "0" * 24
    with api.db.write() as s:
        s.execute(
            insert(Hold),
            [
                {
                    "hold_id": hold_id,
                    "log_index": index,  # the record's leaf: no placement of this hold
                    "request_id": rid,
                    "filter": None,
                    "created_at": utcnow(),
                }
            ],
        )
    size = _log_size(api)
    holds = api.client(api.token("holds"))
    answer = holds.delete(f"/v1/holds/{hold_id}", params={"reason": "closed"})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "hold_not_found"
    assert hold_id not in {h["hold_id"] for h in holds.get("/v1/holds").json()["holds"]}
    assert _log_size(api) == size


def test_a_logged_release_of_a_hold_never_placed_fails_the_audit(api: Harness):
    """The release a superuser's row once let the route sign, with the row deleted since."""
    hold_id = "hold-" + "1" * 24
    body = release_body(
        hold_id=hold_id, reason="closed", released_by="admin", released_at="2026-12-06T00:00:00Z"
    )
    at = utcnow()
    with api.db.write() as s:
        (idx,) = log.append(s, [sign_envelope(RELEASE_KIND, body, api.log_key)], at)
    # its index row, as the route wrote it (the hold row it referred to is deleted since)
    su = Superuser(str(api.settings.database_url))
    su.execute(
        [("INSERT INTO hold_releases VALUES (%s, %s, %s)", (hold_id, idx, su.time(at)))],
        ["hold_releases"],
    )
    found = _findings(api)
    assert any(f.index == idx and hold_id in f.message for f in found), found


def test_an_erasure_event_naming_a_digest_nothing_commits_to_fails_the_audit(
    api: Harness, monkeypatch: pytest.MonkeyPatch
):
    """The event a ledger that took its digests from an edited row would have signed."""
    rid, _, _ = _post_v2(api)
    bogus = "sha256:" + "cd" * 32
    checked = erasures._checked_content
    monkeypatch.setattr(
        erasures,
        "_checked_content",
        lambda s, records: {r: {*d, bogus} for r, d in checked(s, records).items()},
    )
    erased = api.client(api.token("erasure")).post(
        f"/v1/records/{rid}/erasure", json={"reason": "dsr"}
    )
    assert erased.status_code == 201, erased.text
    found = [f for f in _findings(api) if f.check == "content"]
    assert len(found) == 1 and "names 1 digest(s)" in found[0].message, found
    assert found[0].index == erased.json()["log_index"]
    # never served as a bundle, which no verifier would accept
    bundle = api.client().get(f"/v1/records/{rid}/evidence")
    assert bundle.status_code == 500 and bundle.json()["error"]["code"] == "index_mismatch"


def _key_leaf(api: Harness, key_id: str) -> int:
    with api.db.read() as s:
        return int(s.scalar(select(SigningKeyRow.log_index).where(SigningKeyRow.key_id == key_id)))


def test_a_record_row_the_log_does_not_back_never_makes_a_resend_a_duplicate(api: Harness):
    """A row inserted under the incoming record's request ID and content hash, at a leaf that
    is no record (the collector key's registration): answered ``duplicate``, the collector
    would drop its only copy of a record the log never held."""
    key, fp = api.setup_collector()
    env, disclosures = record_v2(key, fp, tier=1)
    body = env.body
    with api.db.write() as s:
        s.execute(
            insert(Record),
            [
                {
                    "request_id": body["request_id"],
                    "log_index": _key_leaf(api, key.key_id),
                    "content_hash": sha256_digest(canonicalize(body)),
                    **{c: body[c] for c in ("model", "tier", "pool", "worker_id", "endpoint")},
                    "fingerprint_id": fp,
                    "key_id": key.key_id,
                    "received_at": utcnow(),
                }
            ],
        )
    size = _log_size(api)
    sent = {"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    error = _mismatch(api.client().post("/v1/records", json=sent))
    assert error["details"]["log_index"] == _key_leaf(api, key.key_id), error
    assert _log_size(api) == size
    assert any(f.table == "records" for f in _findings(api))


def test_a_fingerprint_row_the_log_does_not_back_is_neither_a_duplicate_nor_a_home(
    api: Harness,
):
    """A fingerprint never logged, given a row at another leaf: registering it is not answered
    ``duplicate`` (the collector would never send it), and no record is logged under it."""
    key = api.collector()
    fp_env = fingerprint_envelope(key, "never-logged")
    fp = fingerprint_id(fp_env.body)
    with api.db.write() as s:
        s.execute(
            insert(Fingerprint),
            [
                {
                    "fingerprint_id": fp,
                    "key_id": key.key_id,
                    "log_index": _key_leaf(api, key.key_id),
                    "registered_at": utcnow(),
                }
            ],
        )
    size = _log_size(api)
    _mismatch(api.client().post("/v1/fingerprints", content=fp_env.canonical))
    env, disclosures = record_v2(key, fp, tier=1)
    sent = {"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    error = _mismatch(api.client().post("/v1/records", json=sent))
    assert error["details"]["log_index"] == _key_leaf(api, key.key_id), error
    assert _log_size(api) == size


def test_a_logged_record_and_fingerprint_sent_again_are_duplicates(api: Harness):
    key = api.collector()
    fp_env = fingerprint_envelope(key)
    fp = api.client().post("/v1/fingerprints", content=fp_env.canonical).json()["fingerprint_id"]
    fp_again = api.client().post("/v1/fingerprints", content=fp_env.canonical)
    assert fp_again.status_code == 200 and fp_again.json()["status"] == "duplicate", fp_again.text
    env, disclosures = record_v2(key, fp, tier=1)
    sent = {"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    first = api.client().post("/v1/records", json=sent)
    again = api.client().post("/v1/records", json=sent)
    assert again.status_code in (200, 201), again.text
    (result,) = again.json()["results"]
    assert result["status"] == "duplicate"
    assert result["log_index"] == first.json()["results"][0]["log_index"]
