"""Records over real HTTP, on SQLite and Postgres."""

from __future__ import annotations

import base64
import json
import math
import threading

import httpx
import pytest

from api.state import InflightLimit
from ledger.canonical import canonicalize
from ledger.errors import Pushback
from ledger.packing import pack_float32, pack_int32
from ledger.signing import Envelope, verify_envelope
from tests.support.documents import record_body, resign
from tests.support.harness import MAX_BATCH, MAX_BODY, Harness
from tests.support.http import assert_error


def test_round_trip_keeps_every_logprob_bit(api: Harness):
    key, fp = api.setup_collector()
    env = api.record(key, fp, top_k=5, prompt_len=512, out_len=256, seed=11)
    resp = api.post([env])
    assert resp.status_code == 201, resp.text
    assert resp.json()["results"][0]["status"] == "created"

    got = api.client().get(f"/v1/records/{env.body['request_id']}")
    assert got.status_code == 200
    data = got.json()
    back = Envelope.from_dict(data["envelope"])
    verify_envelope(back, key.public_key)
    assert back.canonical == env.canonical
    for field in ("logprobs",):
        sent = base64.b64decode(env.body["choices"][0][field])
        assert base64.b64decode(back.body["choices"][0][field]) == sent
    top_sent = base64.b64decode(env.body["choices"][0]["top_logprobs"]["logprobs"])
    assert base64.b64decode(back.body["choices"][0]["top_logprobs"]["logprobs"]) == top_sent
    assert data["fingerprint_id"] == fp and data["log_index"] >= 0
    assert (
        data["content_hash"]
        == "sha256:" + __import__("hashlib").sha256(canonicalize(env.body)).hexdigest()
    )


def test_subnormal_and_negative_zero_logprobs_survive(api: Harness):
    key, fp = api.setup_collector()
    body = record_body(fp, out_len=4)
    raw = b"".join(
        [b"\x01\x00\x00\x00", b"\x00\x00\x00\x80", b"\xff\xff\x7f\xff", b"\x00\x00\x80\xbf"]
    )
    body["choices"][0]["logprobs"] = base64.b64encode(raw).decode()
    assert api.post([resign(key, body)]).status_code == 201
    back = api.client().get(f"/v1/records/{body['request_id']}").json()
    assert base64.b64decode(back["envelope"]["body"]["choices"][0]["logprobs"]) == raw


def test_identical_duplicate_is_idempotent_and_different_content_conflicts(api: Harness):
    key, fp = api.setup_collector()
    env = api.record(key, fp, request_id="req-idem-" + api.backend, seed=1)
    first = api.post([env])
    assert first.status_code == 201
    again = api.post([env])
    assert again.status_code == 200
    assert again.json()["results"][0]["status"] == "duplicate"
    assert again.json()["results"][0]["log_index"] == first.json()["results"][0]["log_index"]

    changed = api.record(key, fp, request_id=env.body["request_id"], seed=2)
    err = assert_error(api.post([changed]), 409, "record_conflict")
    assert err["details"]["request_id"] == env.body["request_id"]
    assert env.body["request_id"] in err["message"]


def test_conflict_inside_one_batch(api: Harness):
    key, fp = api.setup_collector()
    a = api.record(key, fp, request_id=f"req-twice-{api.backend}", seed=1)
    b = api.record(key, fp, request_id=f"req-twice-{api.backend}", seed=2)
    err = assert_error(api.post([a, b]), 409, "record_conflict")
    assert err["details"]["item"] == 1
    assert api.client().get(f"/v1/records/{a.body['request_id']}").status_code == 404
    # the same envelope twice in one batch is one record
    resp = api.post([a, a])
    assert resp.status_code == 201 and resp.json()["created"] == 1


def test_a_batch_is_atomic(api: Harness):
    key, fp = api.setup_collector()
    good = [api.record(key, fp) for _ in range(3)]
    bad = api.record(key, fp).to_dict()
    bad["signature"]["sig"] = base64.b64encode(b"\x00" * 64).decode()
    err = assert_error(api.post([*good, bad]), 422, "bad_signature")
    assert err["details"]["item"] == 3
    for env in good:
        assert api.client().get(f"/v1/records/{env.body['request_id']}").status_code == 404


def bad_body_cases(fp: str):
    def tweak(fn):
        body = record_body(fp)
        fn(body)
        return body

    return {
        "nan_logprob": (
            tweak(lambda b: b["choices"][0].update(logprobs=pack_float32([math.nan] * 8))),
            "invalid_logprobs",
        ),
        "inf_logprob": (
            tweak(lambda b: b["choices"][0].update(logprobs=pack_float32([-math.inf] * 8))),
            "invalid_logprobs",
        ),
        "negative_token": (
            tweak(lambda b: b.update(prompt_token_ids=pack_int32([1, -5]))),
            "invalid_token_ids",
        ),
        "length_mismatch": (
            tweak(lambda b: b["choices"][0].update(logprobs=pack_float32([-1.0] * 3))),
            "length_mismatch",
        ),
        "schema": (tweak(lambda b: b.update(tier=7)), "schema_violation"),
        "missing_field": (tweak(lambda b: b.pop("usage")), "schema_violation"),
    }


@pytest.mark.parametrize(
    "case",
    ["nan_logprob", "inf_logprob", "negative_token", "length_mismatch", "schema", "missing_field"],
)
def test_invalid_records_get_a_clear_422(api: Harness, case: str):
    key, fp = api.setup_collector()
    body, code = bad_body_cases(fp)[case]
    err = assert_error(api.post([resign(key, body)]), 422, code)
    assert err["details"]["item"] == 0
    assert api.client().get(f"/v1/records/{body['request_id']}").status_code == 404


def test_unknown_and_revoked_keys_are_refused(api: Harness):
    from ledger.signing import SigningKey

    key, fp = api.setup_collector()
    stranger = SigningKey.generate()
    assert_error(api.post([api.record(stranger, fp)]), 422, "unknown_key")
    resp = api.client().post(f"/v1/keys/{key.key_id}/revoke", json={"reason": "compromised"})
    assert resp.status_code == 200 and resp.json()["revoked"] is True
    assert_error(api.post([api.record(key, fp)]), 422, "revoked_key")


def test_record_under_unregistered_fingerprint_is_refused(api: Harness):
    key, _ = api.setup_collector()
    assert_error(api.post([api.record(key, "sha256:" + "1" * 64)]), 422, "unknown_fingerprint")


def test_malformed_requests(api: Harness):
    c = api.client()
    headers = {"content-type": "application/json"}
    assert_error(c.post("/v1/records", content=b"{not json", headers=headers), 400, "invalid_json")
    assert_error(c.post("/v1/records", content=b"", headers=headers), 400, "invalid_json")
    assert_error(
        c.post("/v1/records", content=b'{"envelopes": [NaN]}', headers=headers), 400, "invalid_json"
    )
    assert_error(
        c.post("/v1/records", content=b'{"envelopes": [], "envelopes": []}', headers=headers),
        400,
        "invalid_json",
    )
    huge = b'{"envelopes": [' + b"9" * 5000 + b"]}"
    assert_error(c.post("/v1/records", content=huge, headers=headers), 400, "invalid_json")
    assert_error(c.post("/v1/records", json=[]), 422, "schema_violation")
    assert_error(c.post("/v1/records", json={"envelopes": {}}), 422, "schema_violation")
    assert_error(c.post("/v1/records", json={"envelopes": []}), 422, "empty_batch")
    assert_error(
        c.post("/v1/records", json={"envelopes": [{"kind": "x"}]}), 422, "schema_violation"
    )
    assert_error(
        c.post("/v1/records", content=b"x", headers={"content-type": "text/plain"}),
        400,
        "invalid_json",
    )


def test_limits(api: Harness):
    key, fp = api.setup_collector()
    batch = [api.record(key, fp) for _ in range(MAX_BATCH + 1)]
    err = assert_error(api.post(batch), 413, "batch_too_large")
    assert err["details"]["limit"] == MAX_BATCH
    big = json.dumps({"envelopes": [], "pad": "x" * MAX_BODY}).encode()
    c = api.client()
    assert_error(
        c.post("/v1/records", content=big, headers={"content-type": "application/json"}),
        413,
        "body_too_large",
    )

    def chunks():  # no Content-Length: the limit is enforced while streaming
        for _ in range(MAX_BODY // 65536 + 2):
            yield b" " * 65536

    assert_error(
        c.post("/v1/records", content=chunks(), headers={"content-type": "application/json"}),
        413,
        "body_too_large",
    )


def test_wrong_kind_is_refused(api: Harness):
    key, fp = api.setup_collector()
    env = resign(key, record_body(fp), kind="fingerprint")
    assert_error(api.post([env]), 422, "wrong_kind")


def test_search_filters_and_cursor_pagination(api: Harness):
    key, fp = api.setup_collector()
    model = f"search-model-{api.backend}"
    envs = [api.record(key, fp, model=model, tier=i % 3) for i in range(7)]
    assert api.post(envs).status_code == 201
    c = api.client()
    seen, cursor = [], None
    while True:
        params = {"model": model, "limit": 3, "fields": "meta"}
        if cursor:
            params["cursor"] = cursor
        page = c.get("/v1/records", params=params).json()
        seen += [i["request_id"] for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [e.body["request_id"] for e in envs]
    tier2 = c.get("/v1/records", params={"model": model, "tier": 2}).json()
    assert [i["request_id"] for i in tier2["items"]] == [
        envs[2].body["request_id"],
        envs[5].body["request_id"],
    ]
    assert tier2["items"][0]["envelope"]["body"]["tier"] == 2
    by_fp = c.get("/v1/records", params={"fingerprint_id": fp, "fields": "meta"}).json()
    assert by_fp["count"] == 7
    later = c.get("/v1/records", params={"model": model, "since": "2999-01-01T00:00:00Z"}).json()
    assert later["count"] == 0
    window = c.get(
        "/v1/records",
        params={"model": model, "since": "2000-01-01T00:00:00Z", "until": "2999-01-01T00:00:00Z"},
    ).json()
    assert window["count"] == 7
    assert_error(c.get("/v1/records", params={"cursor": "garbage"}), 422, "invalid_cursor")
    for forged in ("v1:" + "9" * 30, "v1:-5", "v1:1_0", "v1:٣"):
        cursor = base64.urlsafe_b64encode(forged.encode()).decode().rstrip("=")
        assert_error(c.get("/v1/records", params={"cursor": cursor}), 422, "invalid_cursor")
    assert_error(c.get("/v1/records", params={"tier": 5}), 422, "schema_violation")
    assert_error(
        c.get("/v1/records", params={"since": "2020-01-01T00:00:00"}), 422, "invalid_time_range"
    )


def test_unknown_record_is_404(api: Harness):
    assert_error(api.client().get("/v1/records/req-nope"), 404, "record_not_found")


def test_overload_is_pushed_back_with_retry_after(api: Harness):
    key, fp = api.setup_collector()
    limit = api.server.server.config.app.state.ledger.ingest_limit
    saved = limit.inflight
    limit.inflight = limit.limit  # as if every slot were taken
    try:
        resp = api.post([api.record(key, fp)])
    finally:
        limit.inflight = saved
    err = assert_error(resp, 503, "busy")
    assert "retry" in err["message"] and resp.headers["retry-after"] == "1"
    assert api.post([api.record(key, fp)]).status_code == 201


def test_concurrent_batches_sharing_request_ids_each_get_one_consistent_answer(api: Harness):
    """Batches posted at once are appended by the group writer, many to a transaction: every
    record is created exactly once, each repeat answers the index it got, and the log stays
    contiguous (the session's audit rechecks it)."""
    key, fp = api.setup_collector()
    shared = [api.record(key, fp) for _ in range(4)]
    batches = [[shared[i % 4], shared[(i + 1) % 4], api.record(key, fp)] for i in range(24)]
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def post(batch: list[Envelope]) -> None:
        resp = api.post(batch)
        with lock:
            answers.append(resp)

    threads = [threading.Thread(target=post, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in answers) == [201] * 24
    results = [item for r in answers for item in r.json()["results"]]
    created = [r for r in results if r["status"] == "created"]
    assert len(created) == 4 + 24  # each shared record once, each batch's own once
    index_of = {r["request_id"]: r["log_index"] for r in created}
    assert len(set(index_of.values())) == len(index_of)
    assert all(r["log_index"] == index_of[r["request_id"]] for r in results)
    assert sum(r.json()["duplicates"] for r in answers) == 24 * 3 - 28
    for env in shared:
        got = api.client().get(f"/v1/records/{env.body['request_id']}").json()
        assert got["log_index"] == index_of[env.body["request_id"]]


def test_bytes_in_flight_are_bounded_but_one_batch_always_goes():
    limit = InflightLimit(64, max_bytes=1000)
    with limit.admit(5000):  # alone: admitted whatever its size
        with pytest.raises(Pushback) as err, limit.admit(1):
            pass
        assert err.value.code == "busy" and "5000 bytes in flight" in err.value.message
    with limit.admit(600), limit.admit(400):
        assert (limit.inflight, limit.bytes) == (2, 1000)
        with pytest.raises(Pushback), limit.admit(1):
            pass
    assert (limit.inflight, limit.bytes) == (0, 0)
