"""An ``erasures`` row is read only through the erasure event it points to, on SQLite and
Postgres.

With nothing but the app's own database rights (triggers enabled), an ``erasures`` row can be
written for a record and pointed at any leaf, a legal hold's for instance, and then the
erasure guard lets the record's disclosures be deleted (it asks only that such a row exists).
No route may take that row for an erasure: the record, the search, the erasure route, the
evidence bundle and the console answer 500 ``index_mismatch``; a bulk erasure and the
retention purge stop there rather than pass the record over; the audit names the row. And a
bulk erasure's filter must name something: an empty one would erase every record.
"""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from sqlalchemy import delete, func, insert, select

from ledger.errors import IndexMismatch
from ledger.signing import SigningKey
from ledger.storage import erasures, queries
from ledger.storage.audit import audit
from ledger.storage.database import utcnow
from ledger.storage.models import Disclosure, Erasure, LogEntry
from tests.api.ui.test_console_http import Scene, sign_in
from tests.support.documents import record_v2
from tests.support.harness import Harness


@pytest.fixture
def api(fresh_api: Harness) -> Harness:
    """A fresh ledger per test (tests/conftest.py)."""
    return fresh_api


def _post_v2(api: Harness, key: SigningKey, fp: str) -> str:
    env, disclosures = record_v2(key, fp, tier=1)
    resp = api.client().post(
        "/v1/records",
        json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]},
    )
    assert resp.status_code == 201, resp.text
    rid: str = env.body["request_id"]
    return rid


def _hold(api: Harness, request_id: str) -> int:
    placed = api.client(api.token("holds")).post(
        "/v1/holds", json={"request_id": request_id, "reason": "litigation"}
    )
    assert placed.status_code == 201, placed.text
    index: int = placed.json()["log_index"]
    return index


def _forge_erasure(api: Harness, request_id: str, leaf: int, *, delete_content: bool) -> None:
    """As the app's own database role, triggers enabled: an ``erasures`` row for the record
    naming ``leaf``, then (the guard now allows it) the record's disclosures deleted."""
    with api.db.write() as s:
        s.execute(
            insert(Erasure),
            [
                {
                    "request_id": request_id,
                    "log_index": leaf,
                    "reason_code": "request",
                    "created_at": utcnow(),
                }
            ],
        )
        if delete_content:
            s.execute(delete(Disclosure).where(Disclosure.request_id == request_id))


def _mismatch(answer: httpx.Response) -> None:
    assert answer.status_code == 500, answer.text
    assert answer.json()["error"]["code"] == "index_mismatch", answer.text


def _log_size(api: Harness) -> int:
    with api.db.read() as s:
        return int(s.execute(select(func.count()).select_from(LogEntry)).scalar_one())


def _stored(api: Harness, request_id: str) -> int:
    with api.db.read() as s:
        count = select(func.count()).where(Disclosure.request_id == request_id)
        return int(s.execute(count).scalar_one())


def test_an_erasures_row_naming_a_holds_leaf_is_never_an_erasure(api: Harness):
    """The security review's case: a held record, an ``erasures`` row pointing at its hold's
    leaf, its disclosures deleted through the guard. No answer says ``erased``, the erasure
    route is not a 500 from a KeyError, the bundle does not carry the hold as its erasure."""
    key, fp = api.setup_collector()
    rid, other = _post_v2(api, key, fp), _post_v2(api, key, fp)
    assert api.client().post("/v1/log/checkpoint").status_code == 200
    hold_leaf = _hold(api, rid)
    _forge_erasure(api, rid, hold_leaf, delete_content=True)
    assert _stored(api, rid) == 0  # the guard let the delete through
    size = _log_size(api)

    erase = api.client(api.token("erasure"))
    for answer in (
        api.client().get(f"/v1/records/{rid}"),
        api.client().get("/v1/records", params={"content": "erased"}),
        erase.post(f"/v1/records/{rid}/erasure", json={"reason": "dsr"}),
        api.client().get(f"/v1/records/{rid}/evidence"),
    ):
        _mismatch(answer)
        details = answer.json()["error"]["details"]
        assert details == {"log_index": hold_leaf, "request_id": rid}, details
    console = sign_in(Scene(api, rid, fp), api.admin_token)
    page = console.get(f"/ui/records/{rid}")
    assert page.status_code == 500 and "index_mismatch" in page.text
    with pytest.raises(IndexMismatch):
        erasures.erasure_of(api.db, rid)
    assert _log_size(api) == size  # nothing was logged
    assert api.client().get(f"/v1/records/{other}").json()["content"] == "complete"
    found = audit(api.db, api.log_key.public_key).findings
    assert any(f.table == "erasures" and f.index == hold_leaf for f in found), found


def test_an_erasures_row_beside_the_content_stops_a_bulk_erasure_and_the_purge(api: Harness):
    """A row naming a leaf that is not the record's erasure, its content left in place:
    a bulk erasure (dry run or not) and the retention purge do not pass the record over as
    erased, they stop with ``index_mismatch`` before erasing anything of that page."""
    key, fp = api.setup_collector()
    rid = _post_v2(api, key, fp)
    others = [_post_v2(api, key, fp) for _ in range(2)]
    hold_leaf = _hold(api, "req-not-logged")  # a leaf that is no erasure of anything
    _forge_erasure(api, rid, hold_leaf, delete_content=False)
    size, stored = _log_size(api), _stored(api, rid)
    assert stored > 0

    erase = api.client(api.token("erasure"))
    for dry_run in (True, False):
        answer = erase.post(
            "/v1/erasures", json={"filter": {"tier": 1}, "reason": "x", "dry_run": dry_run}
        )
        _mismatch(answer)
        assert answer.json()["error"]["details"]["request_id"] == rid
    with pytest.raises(IndexMismatch) as raised:
        erasures.purge_expired(api.db, api.log_key, 1, now=utcnow() + timedelta(days=2))
    assert raised.value.details == {"log_index": hold_leaf, "request_id": rid}
    assert _log_size(api) == size and _stored(api, rid) == stored
    for other in others:
        assert queries.get_record(api.db, other).content == "complete"
    found = audit(api.db, api.log_key.public_key).findings
    assert any(f.table == "erasures" and f.index == hold_leaf for f in found), found


def test_a_bulk_erasure_with_an_empty_filter_is_refused(api: Harness):
    """``{"filter": {}}`` would match every record: refused (422 ``invalid_parameters``), as
    ``ledger erase`` refuses it, in a dry run too; nothing is erased or logged."""
    key, fp = api.setup_collector()
    rids = [_post_v2(api, key, fp) for _ in range(2)]
    size = _log_size(api)
    erase = api.client(api.token("erasure"))
    for body in (
        {"filter": {}, "reason": "oops", "dry_run": False},
        {"filter": {}, "reason": "oops"},
        {"filter": {"model": None, "tier": None}, "reason": "oops", "dry_run": False},
    ):
        answer = erase.post("/v1/erasures", json=body)
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error["code"] == "invalid_parameters" and "empty filter" in error["message"]
    assert _log_size(api) == size
    for rid in rids:
        assert api.client().get(f"/v1/records/{rid}").json()["content"] == "complete"
    named = erase.post(
        "/v1/erasures", json={"filter": {"pool": "p1"}, "reason": "x", "dry_run": False}
    )
    assert named.status_code == 200 and sorted(named.json()["erased"]) == sorted(rids)


def test_an_erasures_row_naming_another_leaf_does_not_refuse_a_verdict_as_erased(api: Harness):
    """A replay's verdict is refused 410 ``content_erased`` only for a record its erasure
    event erased: a forged row (the content left in place) is ``index_mismatch``, and
    nothing is logged."""
    from ledger import disclosures
    from ledger.storage import verdicts
    from tests.support.documents import verdict_body

    key, fp = api.setup_collector()
    rid = _post_v2(api, key, fp)
    record = api.client().get(f"/v1/records/{rid}").json()
    _forge_erasure(api, rid, _hold(api, "req-not-logged"), delete_content=False)
    size = _log_size(api)
    out = disclosures.make("replay_output", {"kind": "replay_output", "body": {"text": "out"}})
    verdict = verdict_body(record["envelope"]["body"], record["log_index"], "bitwise")
    verdict["output_digest"] = out.digest
    with pytest.raises(IndexMismatch):
        verdicts.append_verdict(api.db, api.log_key, verdict, [out.encoded])
    assert _log_size(api) == size
