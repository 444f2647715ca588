"""Record schema v2 end to end over HTTP, on SQLite and Postgres: record, prove, erase.

A v2 record is ingested with its disclosures; its full bundle verifies with every member
disclosed; erasure deletes the disclosures and cache keys and logs a signed event; the old
bundle still verifies (it carries its disclosures), a new one reports every member erased with
the event; replay answers 410 and the cache misses; the audit passes. Then every way an
operator could remove content without the log saying so is caught by the audit: a disclosure
deleted without an event, an erasure of a held record, a disclosure edited in place, a cache
key left behind.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from ledger import disclosures
from ledger.errors import IndexMismatch, VerificationError
from ledger.evidence import verify_bundle
from ledger.evidence_format import load_bundle
from ledger.inference_record import body_view
from ledger.signing import SigningKey
from ledger.storage import erasures, log, proofs, queries, verdicts
from ledger.storage.audit import audit
from ledger.storage.database import as_utc, utcnow
from ledger.storage.queries import RecordFilter
from tests.support.documents import record_envelope, record_v2, verdict_body
from tests.support.harness import Harness
from tests.support.superuser import Superuser
from tests.support.walk import paths


@pytest.fixture
def api(fresh_api: Harness) -> Harness:
    """A fresh ledger per test (tests/conftest.py)."""
    return fresh_api


def _post_v2(api: Harness, key: SigningKey, fp: str, **kw: Any) -> str:
    env, disclosures = record_v2(key, fp, **{"tier": 1, **kw})
    resp = api.client().post(
        "/v1/records",
        json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]},
    )
    assert resp.status_code == 201, resp.text
    rid: str = env.body["request_id"]
    return rid


def _greedy(api: Harness, key: SigningKey, fp: str, **kw: Any) -> str:
    return _post_v2(api, key, fp, request_extra={"temperature": 0}, text_prompt=True, **kw)


def _bundle(api: Harness, rid: str, redact: str | None = None) -> dict[str, Any]:
    params = {"redact": redact} if redact else None
    resp = api.client().get(f"/v1/records/{rid}/evidence", params=params)
    assert resp.status_code == 200, resp.text
    bundle: dict[str, Any] = resp.json()
    return bundle


def _verify(api: Harness, bundle: dict[str, Any]) -> Any:
    return verify_bundle(load_bundle(json.dumps(bundle).encode()), api.log_key.public_key)


def _cache_key(api: Harness, rid: str) -> str:
    record = api.client().get(f"/v1/records/{rid}").json()
    body = body_view(record)
    resp = api.client().post(
        "/v1/cache/key",
        json={
            "endpoint": body["endpoint"],
            "request": body["request"],
            "fingerprint_id": body["fingerprint_id"],
        },
    )
    assert resp.status_code == 200, resp.text
    key: str = resp.json()["key"]
    return key


def _statuses(verified: Any) -> list[str]:
    return sorted({item.status for item in verified.content.items})


def test_record_prove_erase_and_prove_again(api: Harness):
    key, fp = api.setup_collector()
    rid = _greedy(api, key, fp)
    kept = _greedy(api, key, fp)  # another record: untouched by the erasure
    record = api.client().get(f"/v1/records/{rid}").json()
    assert record["schema_version"] == 2 and record["content"] == "complete"
    assert "prompt" in body_view(record)["request"]
    assert "request" not in record["envelope"]["body"]  # the leaf commits; it does not hold
    cache_key = _cache_key(api, rid)
    assert api.client().get(f"/v1/cache/{cache_key}").json()["request_id"] == rid

    full = _bundle(api, rid)
    verified = _verify(api, full)
    assert _statuses(verified) == ["disclosed"] and verified.content.erasure is None
    members = {i.member for i in verified.content.items}
    assert {"request", "prompt_token_ids", "choices[0].token_ids", "choices[0].logprobs"} <= members
    redacted = _verify(api, _bundle(api, rid, "prompt"))
    statuses = [(i.member, i.status) for i in redacted.content.items]
    assert sorted(s for m, s in statuses if m is None) == ["redacted", "redacted"]  # request,
    assert ("choices[0].token_ids", "disclosed") in statuses  # prompt_token_ids left out

    # Only the erasure scope (or admin) erases.
    refused = api.client(api.token("records:write", "records:read")).post(
        f"/v1/records/{rid}/erasure", json={"reason": "x"}
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "insufficient_scope"
    officer = api.client(api.token("erasure"))
    erased = officer.post(f"/v1/records/{rid}/erasure", json={"reason": "GDPR Art. 17 request"})
    assert erased.status_code == 201, erased.text
    assert erased.json()["status"] == "erased"
    assert erased.json()["erased_digests"] == len(full["envelope"]["body"]["disclosure_digests"])
    again = officer.post(f"/v1/records/{rid}/erasure", json={"reason": "twice"})
    assert again.status_code == 200 and again.json()["status"] == "already_erased"
    assert again.json()["log_index"] == erased.json()["log_index"]

    after = api.client().get(f"/v1/records/{rid}").json()
    assert after["content"] == "erased" and "disclosures" not in after
    assert after["envelope"] == record["envelope"]  # the signed record stays, unchanged
    # The bundle kept before the erasure still proves the content it carries.
    assert _statuses(_verify(api, full)) == ["disclosed"]
    fresh = _verify(api, _bundle(api, rid))
    assert _statuses(fresh) == ["erased"] and fresh.content.erasure is not None
    assert fresh.content.erasure.reason == "GDPR Art. 17 request"
    assert fresh.content.erasure.requested_by == "test"
    miss = api.client().get(f"/v1/cache/{cache_key}")
    assert miss.status_code == 404 and miss.json()["error"]["code"] == "cache_miss"
    replay = api.client().post("/v1/replays", json={"request_id": rid})
    assert replay.status_code == 410 and replay.json()["error"]["code"] == "content_erased"
    assert api.client().get(f"/v1/records/{kept}").json()["content"] == "complete"
    report = audit(api.db, api.log_key.public_key)
    assert report.ok, report.findings

    # A superuser deletes a disclosure of the other record, without an erasure event.
    su = Superuser(str(api.settings.database_url))
    su.execute([("DELETE FROM disclosures WHERE request_id = %s", (kept,))], ["disclosures"])
    # never served as if it were erased: the erasure index does not say so
    for path in (f"/v1/records/{kept}", f"/v1/records/{kept}/evidence"):
        answer = api.client().get(path)
        assert answer.status_code == 500 and answer.json()["error"]["code"] == "index_mismatch"
    listed = api.client().get("/v1/records").json()["items"]
    assert kept not in {i["request_id"] for i in listed} and rid in {
        i["request_id"] for i in listed
    }
    report = audit(api.db, api.log_key.public_key)
    content = [f for f in report.findings if f.check == "content"]
    assert content and all(kept in f.message for f in content), report.findings
    assert "without a logged erasure" in content[0].message


def test_a_v1_record_is_not_erasable(api: Harness):
    key, fp = api.setup_collector()
    env = api.record(key, fp)
    assert api.post([env]).status_code == 201
    rid = env.body["request_id"]
    resp = api.client().post(f"/v1/records/{rid}/erasure", json={"reason": "x"})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "not_erasable"
    assert api.client().get(f"/v1/records/{rid}").json()["content"] == "in_log"
    verified = _verify(api, _bundle(api, rid))
    assert verified.content.schema_version == 1 and verified.content.items == ()
    missing = api.client().post("/v1/records/req-none/erasure", json={"reason": "x"})
    assert missing.status_code == 404


def test_a_hold_blocks_erasure_until_released(api: Harness):
    key, fp = api.setup_collector()
    rid = _post_v2(api, key, fp, pool="legal")
    other = _post_v2(api, key, fp, pool="other")
    holds = api.client(api.token("holds"))
    placed = holds.post("/v1/holds", json={"filter": {"pool": "legal"}, "reason": "case 42"})
    assert placed.status_code == 201, placed.text
    hold_id = placed.json()["hold_id"]
    refused = api.client().post(f"/v1/records/{rid}/erasure", json={"reason": "x"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "legal_hold"
    assert refused.json()["error"]["details"]["hold_id"] == hold_id
    # an erasure token may not place or release holds
    denied = api.client(api.token("erasure")).delete(f"/v1/holds/{hold_id}", params={"reason": "x"})
    assert denied.status_code == 403
    bulk = api.client().post(
        "/v1/erasures",
        json={"filter": {"tier": 1}, "reason": "cleanup", "dry_run": True},
    )
    assert bulk.json()["erased"] == [other] and bulk.json()["held"] == [rid]
    released = holds.delete(f"/v1/holds/{hold_id}", params={"reason": "case closed"})
    assert released.status_code == 200, released.text
    assert holds.delete(f"/v1/holds/{hold_id}", params={"reason": "x"}).status_code == 409
    listed = holds.get("/v1/holds").json()["holds"]
    assert [(h["hold_id"], h["released"]) for h in listed] == [(hold_id, True)]
    ok = api.client().post(f"/v1/records/{rid}/erasure", json={"reason": "x"})
    assert ok.status_code == 201
    report = audit(api.db, api.log_key.public_key)
    assert report.ok, report.findings


def test_a_release_row_without_its_logged_release_does_not_lift_a_hold(api: Harness):
    """A superuser inserts a hold_releases row pointing at a leaf that is no release of the
    hold (another leaf, or on SQLite a text): the hold still holds, and the audit names it."""
    key, fp = api.setup_collector()
    rid = _post_v2(api, key, fp)
    leaf = api.client().get(f"/v1/records/{rid}").json()["log_index"]
    holds = api.client(api.token("holds"))
    placed = holds.post("/v1/holds", json={"request_id": rid, "reason": "case 9"})
    hold_id = placed.json()["hold_id"]
    su = Superuser(str(api.settings.database_url))
    forged = [leaf] if api.db.is_postgres else [leaf, f"{placed.json()['log_index']}x"]
    for index in forged:
        su.execute(
            [
                (
                    "INSERT INTO hold_releases VALUES (%s, %s, %s)",
                    (hold_id, index, su.time(utcnow())),
                )
            ],
            ["hold_releases"],
        )
        listed = holds.get("/v1/holds").json()["holds"]
        assert [(h["hold_id"], h["released"]) for h in listed] == [(hold_id, False)]
        refused = api.client().post(f"/v1/records/{rid}/erasure", json={"reason": "x"})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "legal_hold"
        # nor can it be released, or said to be: the row is an edit, and is named as one
        again = holds.delete(f"/v1/holds/{hold_id}", params={"reason": "closed"})
        assert again.status_code == 500 and again.json()["error"]["code"] == "index_mismatch"
        found = audit(api.db, api.log_key.public_key).findings
        assert [(f.table, f.column) for f in found] == [("hold_releases", "log_index")], found
        su.execute(
            [("DELETE FROM hold_releases WHERE hold_id = %s", (hold_id,))], ["hold_releases"]
        )
    assert holds.delete(f"/v1/holds/{hold_id}", params={"reason": "closed"}).status_code == 200


def _holds_as_logged(api: Harness, held: str, placed: list[dict[str, Any]]) -> None:
    """Every answer about holds is the log's: the placed holds listed, the held record
    refused (409, in bulk ``held``), found by ``held=true``."""
    holds = api.client(api.token("holds"))
    listed = holds.get("/v1/holds")
    assert listed.status_code == 200, listed.text
    assert [(h["hold_id"], h["log_index"], h["released"]) for h in listed.json()["holds"]] == [
        (p["hold_id"], p["log_index"], False) for p in placed
    ]
    erase = api.client(api.token("erasure"))
    refused = erase.post(f"/v1/records/{held}/erasure", json={"reason": "x"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "legal_hold"
    bulk = erase.post("/v1/erasures", json={"filter": {"tier": 1}, "reason": "x"})
    assert bulk.status_code == 200 and bulk.json()["held"] == [held], bulk.text
    found = api.client().get("/v1/records", params={"held": "true"})
    assert [i["request_id"] for i in found.json()["items"]] == [held], found.text
    assert api.client().get(f"/v1/records/{held}").json()["content"] == "complete"


def test_hold_rows_pointed_at_other_leaves_change_no_hold(api: Harness):
    """A superuser points a ``holds`` row at a leaf that is not its placement: a record's
    leaf, or another hold's (whose scope the row would take on, so the held record could be
    erased). Holds are read from their leaves: every answer stays the log's, a release
    beside the edited row is ``index_mismatch`` (nothing logged), and the audit names it."""
    key, fp = api.setup_collector()
    held, other = _post_v2(api, key, fp), _post_v2(api, key, fp)
    holds = api.client(api.token("holds"))
    mine = holds.post("/v1/holds", json={"request_id": held, "reason": "case 1"}).json()
    wide = holds.post("/v1/holds", json={"filter": {"pool": "none"}, "reason": "case 2"}).json()
    record_leaf = api.client().get(f"/v1/records/{other}").json()["log_index"]
    su = Superuser(str(api.settings.database_url))
    edit = "UPDATE holds SET log_index = %s WHERE hold_id = %s"
    swap = [  # the two holds' rows trade leaves (log_index is unique: by way of the record's)
        (edit, (record_leaf, mine["hold_id"])),
        (edit, (mine["log_index"], wide["hold_id"])),
        (edit, (wide["log_index"], mine["hold_id"])),
    ]
    for edits in ([(edit, (record_leaf, mine["hold_id"]))], swap):
        su.execute(edits, ["holds"])
        _holds_as_logged(api, held, [mine, wide])
        size = _log_size(api)
        released = holds.delete(f"/v1/holds/{mine['hold_id']}", params={"reason": "closed"})
        assert released.status_code == 500, released.text
        assert released.json()["error"]["code"] == "index_mismatch"
        assert _log_size(api) == size
        found = audit(api.db, api.log_key.public_key).findings
        assert any(f.table == "holds" for f in found), found
        restore = [
            (edit, (record_leaf, mine["hold_id"])),
            (edit, (wide["log_index"], wide["hold_id"])),
            (edit, (mine["log_index"], mine["hold_id"])),
        ]
        su.execute(restore, ["holds"])
        assert audit(api.db, api.log_key.public_key).ok


def test_deleted_hold_rows_lift_no_hold_and_release_nothing_twice(api: Harness):
    """A superuser deletes a hold's row: the hold still holds (listed, erasure 409, bulk
    ``held``, ``held=true``), and it cannot be released beside the missing row. Deletes a
    release's row: the hold is still released, and a second release is 409
    ``hold_released``; nothing is logged either way."""
    key, fp = api.setup_collector()
    held = _post_v2(api, key, fp)
    holds = api.client(api.token("holds"))
    placed = holds.post("/v1/holds", json={"request_id": held, "reason": "case 3"}).json()
    su = Superuser(str(api.settings.database_url))
    su.execute([("DELETE FROM holds WHERE hold_id = %s", (placed["hold_id"],))], ["holds"])
    _holds_as_logged(api, held, [placed])
    size = _log_size(api)
    again = holds.delete(f"/v1/holds/{placed['hold_id']}", params={"reason": "closed"})
    assert again.status_code == 500 and again.json()["error"]["code"] == "index_mismatch"
    assert _log_size(api) == size

    second = _post_v2(api, key, fp)
    other = holds.post("/v1/holds", json={"request_id": second, "reason": "case 4"}).json()
    assert holds.delete(f"/v1/holds/{other['hold_id']}", params={"reason": "x"}).status_code == 200
    su.execute(
        [("DELETE FROM hold_releases WHERE hold_id = %s", (other["hold_id"],))],
        ["hold_releases"],
    )
    size = _log_size(api)
    twice = holds.delete(f"/v1/holds/{other['hold_id']}", params={"reason": "closed"})
    assert twice.status_code == 409 and twice.json()["error"]["code"] == "hold_released"
    listed = {h["hold_id"]: h["released"] for h in holds.get("/v1/holds").json()["holds"]}
    assert listed == {placed["hold_id"]: False, other["hold_id"]: True}
    assert _log_size(api) == size
    found = audit(api.db, api.log_key.public_key).findings
    assert {f.table for f in found} >= {"holds", "hold_releases"}, found


def test_retention_and_bulk_erasure_erase_exactly_what_the_dry_run_listed(api: Harness):
    key, fp = api.setup_collector()
    old = [_post_v2(api, key, fp) for _ in range(4)]
    held = _post_v2(api, key, fp)
    erasures.place_hold(
        api.db, api.log_key, request_id=held, filter=None, reason="litigation", placed_by="t"
    )
    cutoff = utcnow()
    new = [_post_v2(api, key, fp) for _ in range(3)]
    # "now" such that the cutoff (now - 200 days) falls between the old records and the new
    result = erasures.purge_expired(api.db, api.log_key, 200, now=cutoff + timedelta(days=200))
    assert sorted(result.erased) == sorted(old) and result.held == [held]
    for rid in old:
        assert queries.get_record(api.db, rid).content == "erased"
    for rid in [held, *new]:
        assert queries.get_record(api.db, rid).content == "complete"
    bundle = _verify(api, _bundle(api, old[0]))
    assert bundle.content.erasure is not None and bundle.content.erasure.reason_code == "retention"

    dry = (
        api.client()
        .post("/v1/erasures", json={"filter": {"pool": "p1"}, "reason": "offboarding"})
        .json()
    )
    assert dry["dry_run"] and sorted(dry["erased"]) == sorted(new) and dry["held"] == [held]
    assert all(queries.get_record(api.db, r).content == "complete" for r in new)
    real = (
        api.client()
        .post(
            "/v1/erasures",
            json={"filter": {"pool": "p1"}, "reason": "offboarding", "dry_run": False},
        )
        .json()
    )
    assert real["erased"] == dry["erased"] and real["held"] == dry["held"]
    assert all(queries.get_record(api.db, r).content == "erased" for r in new)
    metrics = api.client(None).get("/metrics").text
    assert 'ledger_content_erased_total{reason="request"} 3.0' in metrics
    report = audit(api.db, api.log_key.public_key)
    assert report.ok, report.findings


def test_the_retention_purge_reads_only_records_that_hold_content(
    api: Harness, monkeypatch: pytest.MonkeyPatch
):
    """v1 records (content in the leaf) are never erasable: the hourly purge does not read
    them again on every run, while a bulk erasure still counts them as not erasable."""
    key, fp = api.setup_collector()
    v1 = [api.record(key, fp) for _ in range(3)]
    assert api.post(v1).status_code == 201
    v2 = [_post_v2(api, key, fp) for _ in range(2)]
    read: list[str] = []
    real_candidates = erasures._candidates

    def counted(*args: Any, **kwargs: Any) -> Any:
        page = real_candidates(*args, **kwargs)
        read.extend(r.request_id for r in page)
        return page

    monkeypatch.setattr(erasures, "_candidates", counted)
    dry = erasures.erase_matching(
        api.db, api.log_key, RecordFilter(), reason="x", requested_by="t", dry_run=True
    )
    assert dry.not_erasable == 3 and sorted(dry.erased) == sorted(v2) and len(read) == 5
    read.clear()
    later = utcnow() + timedelta(days=400)
    result = erasures.purge_expired(api.db, api.log_key, 200, now=later)
    assert sorted(result.erased) == sorted(v2) and result.not_erasable == 0
    assert sorted(read) == sorted(v2)  # none of the v1 records was read
    for env in v1:
        assert queries.get_record(api.db, env.body["request_id"]).content == "in_log"
    assert erasures.purge_expired(api.db, api.log_key, 200, now=later).erased == []
    report = audit(api.db, api.log_key.public_key)
    assert report.ok, report.findings


def test_an_erasure_that_ignored_a_hold_fails_the_audit(api: Harness):
    key, fp = api.setup_collector()
    rid = _post_v2(api, key, fp)
    erasures.place_hold(
        api.db, api.log_key, request_id=rid, filter=None, reason="case 7", placed_by="t"
    )
    # An operator bypasses the check (the service refuses; the audit must notice anyway).
    with api.db.write() as s:
        stored = queries.record_in(s, rid)
        committed = erasures._checked_content(s, [stored])
        erasures._erase_in(
            s,
            api.log_key,
            [stored],
            committed,
            reason_code="request",
            reason="x",
            requested_by="rogue",
        )
    report = audit(api.db, api.log_key.public_key)
    assert any("legal hold" in f.message and f.check == "content" for f in report.findings)


def test_content_edits_are_caught(api: Harness):
    key, fp = api.setup_collector()
    edited = _greedy(api, key, fp)
    erased = _greedy(api, key, fp)
    su = Superuser(str(api.settings.database_url))
    rows = su.query("SELECT digest, disclosure FROM disclosures WHERE request_id = %s", (edited,))
    digest, disclosure = rows[0]
    forged = disclosure[:-2] + ("A" if disclosure[-2] != "A" else "B") + disclosure[-1]
    su.execute(
        [
            (
                "UPDATE disclosures SET disclosure = %s WHERE request_id = %s AND digest = %s",
                (forged, edited, digest),
            )
        ],
        ["disclosures"],
    )
    resp = api.client().get(f"/v1/records/{edited}")
    assert resp.status_code == 500 and resp.json()["error"]["code"] == "index_mismatch"
    # an erased record whose cache key row is put back
    keys = su.query(
        "SELECT cache_key, log_index, tier FROM cache_keys WHERE request_id = %s", (erased,)
    )
    api.client(api.token("erasure")).post(f"/v1/records/{erased}/erasure", json={"reason": "r"})
    su.execute(
        [
            (
                "INSERT INTO cache_keys VALUES (%s, %s, %s, %s, %s)",
                (keys[0][0], erased, keys[0][1], keys[0][2], True),
            )
        ],
        ["cache_keys"],
    )
    report = audit(api.db, api.log_key.public_key)
    messages = [f.message for f in report.findings if f.check in ("content", "index")]
    assert any(edited in m and "disclosure" in m for m in messages), report.findings
    assert any(erased in m and "remain" in m for m in messages), report.findings


def test_a_replay_output_filed_under_another_record_is_still_erased_and_caught(api: Harness):
    """A replay's output is content of the record it replayed, stored at the verdict's leaf.
    A superuser who files it under another request ID must neither keep it past the
    record's erasure nor go unnoticed; nor may a copy put back after the erasure."""
    key, fp = api.setup_collector()
    rid = _greedy(api, key, fp)
    leaf = api.client().get(f"/v1/records/{rid}").json()["log_index"]
    out = disclosures.make("replay_output", {"kind": "replay_output", "body": {"text": "out"}})
    body = verdict_body(queries_body(api, rid), leaf, "bitwise", output_digest=out.digest)
    verdict = verdicts.append_verdict(api.db, api.log_key, body, [out.encoded])
    assert audit(api.db, api.log_key.public_key).ok
    su = Superuser(str(api.settings.database_url))
    su.execute(
        [
            (
                "UPDATE disclosures SET request_id = %s WHERE log_index = %s",
                ("another-record", verdict.log_index),
            )
        ],
        ["disclosures"],
    )
    found = audit(api.db, api.log_key.public_key).findings
    assert [(f.index, f.table, f.column) for f in found] == [
        (verdict.log_index, "disclosures", "request_id")
    ], found

    # The erasure takes the output at the verdict's leaf whatever ID it is filed under; the
    # database refuses to delete a row under an ID with no erasure, so it fails whole.
    erase = api.client(api.token("erasure"))
    resp = erase.post(f"/v1/records/{rid}/erasure", json={"reason": "r"})
    assert resp.status_code == 409, resp.text
    assert resp.json()["error"]["code"] == "rejected_by_database"
    assert api.client().get(f"/v1/records/{rid}").json()["content"] != "erased"
    su.execute(
        [
            (
                "UPDATE disclosures SET request_id = %s WHERE log_index = %s",
                (rid, verdict.log_index),
            )
        ],
        ["disclosures"],
    )
    resp = erase.post(f"/v1/records/{rid}/erasure", json={"reason": "r"})
    assert resp.status_code == 201, resp.text
    # the event names the record's digests and its replay's output
    assert resp.json()["erased_digests"] == len(body_digests(api, rid)) + 1
    replay = api.client().get(f"/v1/replays/{body['replay_id']}").json()
    assert not replay.get("disclosures"), replay
    assert audit(api.db, api.log_key.public_key).ok

    # put back after the erasure, under any request ID: the audit names the verdict's leaf
    for filed_under in ("another-record", rid):
        su.execute(
            [
                (
                    "INSERT INTO disclosures VALUES (%s, %s, %s, %s)",
                    (filed_under, out.digest, verdict.log_index, out.encoded),
                )
            ],
            ["disclosures"],
        )
        found = audit(api.db, api.log_key.public_key).findings
        assert any(f.index == verdict.log_index and f.table == "disclosures" for f in found) or (
            any(rid in f.message and "remain" in f.message for f in found)
        ), found
        su.execute(
            [("DELETE FROM disclosures WHERE log_index = %s", (verdict.log_index,))],
            ["disclosures"],
        )


def queries_body(api: Harness, rid: str) -> dict[str, Any]:
    """The record's signed body, as logged."""
    resp = api.client().get(f"/v1/records/{rid}")
    body: dict[str, Any] = resp.json()["envelope"]["body"]
    return body


def body_digests(api: Harness, rid: str) -> list[str]:
    return list(queries_body(api, rid)["disclosure_digests"])


@pytest.mark.parametrize("older", ["inference-ledger/evidence/v2", "inference-ledger/evidence/v1"])
def test_a_v2_record_relabelled_in_an_older_bundle_format_is_invalid(api: Harness, older: str):
    """Older formats have no content members: relabelled, a v3 bundle of a v2 record would
    verify with its content (and for v1, its fingerprint) checks left out."""
    key, fp = api.setup_collector()
    bundle = _bundle(api, _greedy(api, key, fp))
    bundle = {k: v for k, v in bundle.items() if k not in ("disclosures", "erasure")}
    bundle["format"] = older
    if older.endswith("v1"):
        del bundle["fingerprint"], bundle["keys"]["fingerprint_signer"]
    with pytest.raises(VerificationError) as err:
        _verify(api, bundle)
    assert err.value.details["check"] == "format" and "schema version 1" in err.value.message


def test_disclosures_planted_at_a_v1_record_are_caught(api: Harness):
    """A v1 record takes no disclosures: a valid disclosure row copied to its leaf, under its
    request ID, is an edit of the disclosures table, and the record's own rows still compare."""
    key, fp = api.setup_collector()
    donor = _greedy(api, key, fp)
    env = record_envelope(key, fp)
    resp = api.client().post("/v1/records", json={"records": [{"envelope": env.to_dict()}]})
    assert resp.status_code == 201, resp.text
    v1 = env.body["request_id"]
    su = Superuser(str(api.settings.database_url))
    [(leaf,)] = su.query("SELECT log_index FROM records WHERE request_id = %s", (v1,))
    digest, disclosure = su.query(
        "SELECT digest, disclosure FROM disclosures WHERE request_id = %s", (donor,)
    )[0]
    su.execute(
        [
            (
                "INSERT INTO disclosures (request_id, digest, log_index, disclosure) "
                "VALUES (%s, %s, %s, %s)",
                (v1, digest, leaf, disclosure),
            )
        ],
        ["disclosures"],
    )
    su.execute(
        [("UPDATE records SET model = %s WHERE request_id = %s", ("forged", v1))], ["records"]
    )
    report = audit(api.db, api.log_key.public_key)
    at_leaf = [(f.check, f.table, f.column) for f in report.findings if f.index == leaf]
    assert ("content", "disclosures", "log_index") in at_leaf, report.findings
    assert ("index", "records", "model") in at_leaf, report.findings


def test_no_member_of_a_v2_bundle_can_be_changed_unnoticed(api: Harness):
    """Every value of a full v2 bundle and of an erased record's bundle, changed and removed:
    each is INVALID but ``exported_at`` (nothing signs it) and, in the erased one, removing
    the erasure event (the digests are then reported redacted, which the bundle makes true)."""
    key, fp = api.setup_collector()
    full_id, erased_id = _greedy(api, key, fp), _greedy(api, key, fp)
    api.client().post(f"/v1/records/{erased_id}/erasure", json={"reason": "r"})
    for rid, allowed in (
        (full_id, {("change", ("exported_at",))}),
        (erased_id, {("change", ("exported_at",)), ("remove", ("erasure",))}),
    ):
        bundle = _bundle(api, rid)
        assert _verify(api, bundle)  # VALID as exported
        unnoticed = set()
        for path in paths(bundle):
            edits: list[tuple[str, Any]] = [("change", _change_at)]
            if path and isinstance(path[-1], str):
                edits.append(("remove", lambda parent, k: parent.pop(k)))
            for name, edit in edits:
                forged = json.loads(json.dumps(bundle))
                if not path:
                    continue
                parent = forged
                for p in path[:-1]:
                    parent = parent[p]
                edit(parent, path[-1])
                try:
                    _verify(api, forged)
                except Exception as exc:
                    assert type(exc).__name__ == "VerificationError", exc
                    continue
                unnoticed.add((name, path))
        assert unnoticed == allowed, sorted(unnoticed)


def _change_at(parent: Any, key: Any) -> None:
    value = parent[key]
    if isinstance(value, bool):
        parent[key] = not value
    elif isinstance(value, int):
        parent[key] = value + 1
    elif isinstance(value, str):
        parent[key] = value[:-1] + ("A" if value[-1:] != "A" else "B") if value else "x"
    elif value is None:
        parent[key] = "x"
    elif isinstance(value, list):
        parent[key] = [*value, json.loads(json.dumps(value[-1])) if value else "x"]
    else:
        parent[key] = {**value, "x": 1}


def test_a_replay_that_ends_after_an_erasure_stores_none_of_the_content(api: Harness):
    """A replay reads the record's content, then waits minutes for its worker; an erasure in
    between deletes the content. The verdict the replay then logs would store the replayed
    output again (content of the erased record): it is refused instead, 410
    ``content_erased``, nothing is logged, and the audit still passes."""
    from ledger.errors import Gone

    key, fp = api.setup_collector()
    rid = _greedy(api, key, fp)
    leaf = api.client().get(f"/v1/records/{rid}").json()["log_index"]
    body = queries_body(api, rid)  # what the replay holds while its worker answers
    erase = api.client(api.token("erasure"))
    assert erase.post(f"/v1/records/{rid}/erasure", json={"reason": "r"}).status_code == 201
    with api.db.read() as s:
        size = log.log_size(s)
    out = disclosures.make("replay_output", {"kind": "replay_output", "body": {"text": "out"}})
    verdict = verdict_body(body, leaf, "bitwise", output_digest=out.digest)
    with pytest.raises(Gone) as refused:
        verdicts.append_verdict(api.db, api.log_key, verdict, [out.encoded])
    assert refused.value.details == {"request_id": rid}
    missing = api.client().get(f"/v1/replays/{verdict['replay_id']}")
    assert missing.status_code == 404, missing.text
    with api.db.read() as s:
        assert log.log_size(s) == size
    assert audit(api.db, api.log_key.public_key).ok


def test_a_verdict_is_served_only_as_its_leaf_logged_it(api: Harness):
    """``GET /v1/replays/{id}`` and a record's replay list read each verdict from its leaf:
    an edited verdict column shows nothing false, a row pointed at another leaf and a replay
    output that opens no digest of the verdict are 500 ``index_mismatch``, never an answer."""
    key, fp = api.setup_collector()
    rid = _greedy(api, key, fp)
    leaf = api.client().get(f"/v1/records/{rid}").json()["log_index"]
    out = disclosures.make("replay_output", {"kind": "replay_output", "body": {"text": "out"}})
    body = verdict_body(queries_body(api, rid), leaf, "diverged", output_digest=out.digest)
    stored = verdicts.append_verdict(api.db, api.log_key, body, [out.encoded])
    path = f"/v1/replays/{body['replay_id']}"
    assert api.client().get(path).json()["disclosures"] == [out.encoded]
    su = Superuser(str(api.settings.database_url))
    forged = disclosures.make("replay_output", {"kind": "replay_output", "body": {"text": "x"}})
    edits = [
        ("UPDATE replays SET verdict = %s WHERE replay_id = %s", ("bitwise", body["replay_id"])),
        (
            "UPDATE disclosures SET disclosure = %s WHERE log_index = %s",
            (forged.encoded, stored.log_index),
        ),
        ("UPDATE replays SET log_index = %s WHERE replay_id = %s", (leaf, body["replay_id"])),
    ]
    su.execute(edits[:1], ["replays"])
    listed = api.client().get(f"/v1/records/{rid}").json()["replays"]
    assert [r["verdict"] for r in listed] == ["diverged"], listed
    su.execute(edits[1:2], ["disclosures"])
    answer = api.client().get(path)
    assert answer.status_code == 500 and answer.json()["error"]["code"] == "index_mismatch"
    su.execute(
        [
            (
                "UPDATE disclosures SET disclosure = %s WHERE log_index = %s",
                (out.encoded, stored.log_index),
            )
        ],
        ["disclosures"],
    )
    assert api.client().get(path).status_code == 200
    su.execute(edits[2:], ["replays"])
    for answer in (api.client().get(path), api.client().get(f"/v1/records/{rid}")):
        assert answer.status_code == 500 and answer.json()["error"]["code"] == "index_mismatch"
    # pointed at no leaf at all: named, not hidden
    su.execute(
        [("UPDATE replays SET log_index = %s WHERE replay_id = %s", (10**9, body["replay_id"]))],
        ["replays"],
    )
    for answer in (api.client().get(path), api.client().get(f"/v1/records/{rid}")):
        assert answer.status_code == 500 and answer.json()["error"]["code"] == "index_mismatch"


def test_a_bulk_erasure_that_fails_part_way_keeps_no_cache_answer(
    api: Harness, monkeypatch: pytest.MonkeyPatch
):
    """A bulk erasure commits batch by batch: one that fails after its first batch (here an
    edited row in the second) has erased records whose kept cache answers hold their content.
    The process forgets every kept answer then, not only those it could name."""
    key, fp = api.setup_collector()
    first, second = _greedy(api, key, fp), _greedy(api, key, fp)
    hot = api.server.server.config.app.state.ledger.hot_answers
    view = body_view(api.client().get(f"/v1/records/{first}").json())
    lookup = {"endpoint": view["endpoint"], "request": view["request"], "fingerprint_id": fp}
    for _ in range(2):
        assert api.client().post("/v1/cache/lookup", json=lookup).json()["request_id"] == first
    assert any(k.found.hit and k.found.hit.request_id == first for k, _ in hot._items.values())
    holds = api.client(api.token("holds"))
    later = holds.post("/v1/holds", json={"request_id": "req-none", "reason": "x"}).json()
    su = Superuser(str(api.settings.database_url))
    su.execute(  # the second record's row now names a leaf after the first's: no record
        [
            (
                "UPDATE records SET log_index = %s WHERE request_id = %s",
                (later["log_index"], second),
            )
        ],
        ["records"],
    )
    monkeypatch.setattr(erasures, "CHUNK", 1)
    failed = api.client(api.token("erasure")).post(
        "/v1/erasures",
        json={"filter": {"fingerprint_id": fp}, "reason": "r", "dry_run": False},
    )
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "index_mismatch"
    assert api.client().get(f"/v1/records/{first}").json()["content"] == "erased"
    assert not hot._items


def test_a_receive_time_respelled_in_another_zone_is_caught_and_moves_no_cutoff(api: Harness):
    """On SQLite a time is text, and SQL time windows compare that text: a superuser who
    writes a receive time as the same instant in another zone (``-23:00``) moves the record in
    every window while the time still parses equal. The audit takes only the text the ledger
    writes, so it names both columns; and the retention purge decides its cutoff on the time as
    read with the record, so a record not yet due is not erased. (Postgres keeps one
    canonical form: the same edit changes nothing there.)"""
    from datetime import UTC, datetime, timedelta, timezone

    key, fp = api.setup_collector()
    due_later = _post_v2(api, key, fp)
    shown = api.client().get(f"/v1/records/{due_later}").json()
    at = datetime.fromisoformat(shown["received_at"]).astimezone(UTC)
    su = Superuser(str(api.settings.database_url))
    respelled = at.astimezone(timezone(timedelta(hours=-23)))
    value = respelled if su.postgres else respelled.isoformat(" ", "microseconds")
    for table, column, match in (  # the index column alone, then the log entry's time too
        ("records", "received_at", lambda r: r["request_id"] == due_later),
        ("log_entries", "appended_at", lambda r: r["idx"] == shown["log_index"]),
    ):
        (row,) = [rid for rid, r in su.rows(table) if match(r)]
        su.set(table, row, column, value)
        found = audit(api.db, api.log_key.public_key).findings
        if su.postgres:
            assert not found, found
        else:
            assert (table, column) in {(f.table, f.column) for f in found}, found
    purged = erasures.purge_expired(api.db, api.log_key, 1, now=at + timedelta(hours=12))
    assert purged.erased == [], purged
    assert api.client().get(f"/v1/records/{due_later}").json()["content"] != "erased"


def test_a_read_sees_one_moment_while_the_record_is_erased(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record read while it is erased is read whole before or after, never half: its
    disclosures and its erasure state come from one snapshot. (On Postgres under READ
    COMMITTED each statement saw its own moment, and an erasure committed between them made
    the read answer 500 index_mismatch and log a false "edited database" warning.)"""
    key, fp = api.setup_collector()
    rids = [_greedy(api, key, fp) for _ in range(2)]
    assert api.client().post("/v1/log/checkpoint").status_code == 200
    real_erased, real_disclosures = queries.erased_ids, queries.disclosures_at

    def erase_first(rid: str, real: Any) -> Any:
        pending = [rid]  # once: the erasure itself reads through the same function

        def between(session: Any, ids: Any) -> Any:
            if pending:
                erasures.erase(api.db, api.log_key, pending.pop(), reason="r", requested_by="t")
            return real(session, ids)

        return between

    # get_record reads disclosures, then the erasure state: the erasure lands between
    monkeypatch.setattr(queries, "erased_ids", erase_first(rids[0], real_erased))
    record = queries.get_record(api.db, rids[0])
    assert record.content == "complete"  # the moment before the erasure, whole
    monkeypatch.setattr(queries, "erased_ids", real_erased)
    assert queries.get_record(api.db, rids[0]).content == "erased"
    # the evidence reads the erasure, then the disclosures: the erasure lands between
    monkeypatch.setattr(queries, "disclosures_at", erase_first(rids[1], real_disclosures))
    bundle = proofs.evidence(api.db, api.log_key, "o", rids[1])
    assert "erasure" not in bundle and bundle["disclosures"]
    monkeypatch.setattr(queries, "disclosures_at", real_disclosures)
    assert "erasure" in _bundle(api, rids[1])
    assert audit(api.db, api.log_key.public_key).ok


def test_a_holds_signed_time_is_its_leafs_time_read_under_the_lock(api: Harness) -> None:
    """A hold (and its release) is signed with the time its leaf is appended at, read after
    the append lock is taken: never earlier than the leaf before it (it was read before the
    wait for the lock, so the log and GET /v1/holds could put a hold before an erasure that
    came first). The answers give the signed times."""
    import threading
    import time as clock

    from ledger.clock import rfc3339
    from ledger.storage.models import LogEntry

    key, fp = api.setup_collector()
    rid = _greedy(api, key, fp)
    holding = threading.Event()

    def slow_writer() -> None:
        with api.db.write() as s:
            s.execute(text("SELECT 1"))
            holding.set()
            clock.sleep(0.5)

    writer = threading.Thread(target=slow_writer)
    writer.start()
    holding.wait(5)
    placed = erasures.place_hold(
        api.db, api.log_key, request_id=rid, filter=None, reason="case", placed_by="t"
    )
    writer.join()
    released = erasures.release_hold(
        api.db, api.log_key, placed["hold_id"], reason="closed", released_by="t"
    )
    with api.db.read() as s:
        for answer, member in ((placed, "placed_at"), (released, "released_at")):
            entry = s.get(LogEntry, answer["log_index"])
            assert entry is not None
            body = json.loads(bytes(entry.envelope))["body"]
            assert body[member] == answer[member] == rfc3339(as_utc(entry.appended_at))
    listed = {h["hold_id"]: h for h in erasures.list_holds(api.db)}
    assert listed[placed["hold_id"]]["placed_at"] == placed["placed_at"]


def _log_size(api: Harness) -> int:
    with api.db.read() as s:
        return int(s.execute(text("SELECT count(*) FROM log_entries")).scalar_one())


def _replayed(api: Harness, rid: str) -> str:
    """A bitwise verdict about ``rid`` with its replay output stored; the output's digest."""
    record = api.client().get(f"/v1/records/{rid}").json()
    out = disclosures.make("replay_output", {"kind": "replay_output", "body": {"text": "out"}})
    verdict = verdict_body(record["envelope"]["body"], record["log_index"], "bitwise")
    verdict["output_digest"] = out.digest
    verdicts.append_verdict(api.db, api.log_key, verdict, [out.encoded])
    return out.digest


@pytest.mark.parametrize("deleted", ["record", "replay_output"])
def test_content_deleted_without_an_event_is_never_erased_over(api: Harness, deleted: str):
    """A superuser deletes one disclosure (of the record, or its replay's output) without an
    erasure event. No erasure may log an event over it, which would make the deletion look
    like its own and clear the audit: the single route, a bulk erasure (dry run too) and the
    retention purge answer ``index_mismatch`` naming the record, nothing is logged, and the
    audit still names the deletion."""
    key, fp = api.setup_collector()
    rid, other = _post_v2(api, key, fp, pool="gone"), _post_v2(api, key, fp, pool="kept")
    digest = _replayed(api, rid)
    one_of_its_own = (
        "DELETE FROM disclosures WHERE digest = (SELECT min(digest) FROM disclosures "
        "WHERE request_id = %s AND digest <> %s)"
    )
    su = Superuser(str(api.settings.database_url))
    if deleted == "record":
        su.execute([(one_of_its_own, (rid, digest))], ["disclosures"])
    else:
        su.execute([("DELETE FROM disclosures WHERE digest = %s", (digest,))], ["disclosures"])
    size = _log_size(api)
    erase = api.client(api.token("erasure"))
    answers = [erase.post(f"/v1/records/{rid}/erasure", json={"reason": "dsr"})]
    for dry_run in (True, False):
        answers.append(
            erase.post(
                "/v1/erasures",
                json={"filter": {"pool": "gone"}, "reason": "x", "dry_run": dry_run},
            )
        )
    for answer in answers:
        assert answer.status_code == 500, answer.text
        error = answer.json()["error"]
        assert error["code"] == "index_mismatch" and rid in error["message"], error
    with pytest.raises(IndexMismatch):
        erasures.purge_expired(api.db, api.log_key, 1, now=utcnow() + timedelta(days=2))
    assert _log_size(api) == size
    assert api.client().get(f"/v1/records/{other}").json()["content"] == "complete"
    found = audit(api.db, api.log_key.public_key).findings
    assert any(rid in f.message and f.check == "content" for f in found), found


def test_a_deleted_erasures_row_is_never_erased_again(api: Harness):
    """A record erased, then its ``erasures`` row deleted by a superuser: a bulk erasure (dry
    run or not) must not take the record for one still to erase and log a second event
    beside the first (which no row could ever index again): ``index_mismatch``."""
    key, fp = api.setup_collector()
    rid = _post_v2(api, key, fp, pool="gone")
    erase = api.client(api.token("erasure"))
    assert erase.post(f"/v1/records/{rid}/erasure", json={"reason": "dsr"}).status_code == 201
    su = Superuser(str(api.settings.database_url))
    su.execute([("DELETE FROM erasures WHERE request_id = %s", (rid,))], ["erasures"])
    size = _log_size(api)
    for dry_run in (True, False):
        answer = erase.post(
            "/v1/erasures", json={"filter": {"pool": "gone"}, "reason": "x", "dry_run": dry_run}
        )
        assert answer.status_code == 500, answer.text
        assert answer.json()["error"]["code"] == "index_mismatch"
    assert _log_size(api) == size


def test_the_hold_leaves_index_names_the_hold_kinds():
    """Holds are read through the partial index of their kinds: its predicate is theirs."""
    from ledger.erasure import HOLD_KIND, RELEASE_KIND
    from ledger.storage.models import HOLD_LEAVES

    assert f"kind IN ('{HOLD_KIND}', '{RELEASE_KIND}')" == HOLD_LEAVES


def test_a_hold_names_exactly_one_of_a_request_id_and_a_filter(api: Harness):
    """``{"request_id", "filter": {}}`` is both, an empty filter or one of nulls names
    nothing: 422 ``invalid_parameters``, and nothing is logged."""
    key, fp = api.setup_collector()
    rid = _post_v2(api, key, fp)
    holds = api.client(api.token("holds"))
    size = _log_size(api)
    for body in (
        {"request_id": rid, "filter": {}},
        {"request_id": rid, "filter": {"tier": None}},
        {"request_id": rid, "filter": {"pool": "p1"}},
        {"filter": {}},
        {"filter": {"tier": None, "model": None}},
        {},
    ):
        answer = holds.post("/v1/holds", json={**body, "reason": "x"})
        assert answer.status_code == 422, (body, answer.text)
        assert answer.json()["error"]["code"] == "invalid_parameters", answer.text
    assert _log_size(api) == size
    assert holds.post("/v1/holds", json={"request_id": rid, "reason": "x"}).status_code == 201


def test_a_verdict_whose_output_row_is_gone_is_served_only_once_erased(api: Harness):
    """A superuser deletes a verdict's replay output without an erasure event: the verdict
    is ``index_mismatch``, never a verdict whose output reads as erased. Once its record is
    erased (with the output restored first), the same verdict is served without it."""
    key, fp = api.setup_collector()
    rid = _post_v2(api, key, fp)
    digest = _replayed(api, rid)
    replay_id = api.client().get(f"/v1/records/{rid}").json()["replays"][0]["replay_id"]
    served = api.client().get(f"/v1/replays/{replay_id}")
    assert served.status_code == 200 and len(served.json()["disclosures"]) == 1
    su = Superuser(str(api.settings.database_url))
    kept = su.query("SELECT * FROM disclosures WHERE digest = %s", (digest,))
    su.execute([("DELETE FROM disclosures WHERE digest = %s", (digest,))], ["disclosures"])
    gone = api.client().get(f"/v1/replays/{replay_id}")
    assert gone.status_code == 500 and gone.json()["error"]["code"] == "index_mismatch"
    marks = ", ".join(["%s"] * len(kept[0]))
    su.execute([(f"INSERT INTO disclosures VALUES ({marks})", tuple(kept[0]))], ["disclosures"])
    erase = api.client(api.token("erasure"))
    assert erase.post(f"/v1/records/{rid}/erasure", json={"reason": "dsr"}).status_code == 201
    erased = api.client().get(f"/v1/replays/{replay_id}")
    assert erased.status_code == 200 and "disclosures" not in erased.json(), erased.text


def test_an_erased_records_bundle_is_never_missing_the_verdict_its_event_names(api: Harness):
    """After an erasure that removed a replay's output, a superuser deletes the verdict's
    ``replays`` row: the bundle would carry an event naming a digest nothing in it commits
    to, and would not verify. The route answers ``index_mismatch`` instead; a ``replays``
    row pointing at a leaf that is no verdict of the record is one too."""
    key, fp = api.setup_collector()
    rid, other = _post_v2(api, key, fp), _post_v2(api, key, fp)
    _replayed(api, rid)
    erase = api.client(api.token("erasure"))
    assert erase.post(f"/v1/records/{rid}/erasure", json={"reason": "dsr"}).status_code == 201
    assert api.client().post("/v1/log/checkpoint").status_code == 200
    _verify(api, _bundle(api, rid))
    su = Superuser(str(api.settings.database_url))
    row = su.query("SELECT replay_id, log_index FROM replays WHERE request_id = %s", (rid,))[0]
    su.execute([("DELETE FROM replays WHERE request_id = %s", (rid,))], ["replays"])
    answer = api.client().get(f"/v1/records/{rid}/evidence")
    assert answer.status_code == 500 and answer.json()["error"]["code"] == "index_mismatch"
    other_leaf = api.client().get(f"/v1/records/{other}").json()["log_index"]
    su.execute(
        [
            (
                "INSERT INTO replays (replay_id, request_id, log_index, verdict, pool, "
                "worker_id, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (row[0], rid, other_leaf, "bitwise", "p1", "w1", su.time(utcnow())),
            )
        ],
        ["replays"],
    )
    answer = api.client().get(f"/v1/records/{rid}/evidence")
    assert answer.status_code == 500 and answer.json()["error"]["code"] == "index_mismatch"
