"""``?redact=`` on ``GET /v1/records/{id}/evidence`` and the v2 ingest refusals over HTTP, on
SQLite and Postgres: a redact name no record can hold is refused (422 naming the valid
names), never answered with the bundle unchanged; a record whose salts repeat, or whose clear
members carry content, is refused at ``POST /v1/records``."""

from __future__ import annotations

import pytest

from ledger import disclosures
from ledger.record_v2 import commit_record, content_members
from ledger.records import RECORD_KIND
from ledger.signing import sign_envelope
from tests.support.documents import record_body, record_v2
from tests.support.harness import Harness
from tests.support.http import assert_error


def _post(api: Harness, envelope: dict, encoded: list[str]):
    return api.client().post(
        "/v1/records", json={"records": [{"envelope": envelope, "disclosures": encoded}]}
    )


@pytest.mark.parametrize(
    "redact",
    ["choices[0].margins", "replay_output", "choices[99999].text", "text,choices[0].margins"],
)
def test_a_redact_name_no_record_holds_is_refused(api: Harness, redact: str):
    key, fp = api.setup_collector()
    env, encoded = record_v2(key, fp)
    assert _post(api, env.to_dict(), encoded).status_code == 201
    rid = env.body["request_id"]
    whole = api.client().get(f"/v1/records/{rid}/evidence").json()
    assert len(whole["disclosures"]) == len(encoded)
    err = assert_error(
        api.client().get(f"/v1/records/{rid}/evidence", params={"redact": redact}),
        422,
        "invalid_parameters",
    )
    assert err["details"]["unknown"] == [redact.split(",")[-1]]
    assert "choices[N].text" in err["details"]["members"]
    assert err["details"]["groups"] == ["logprobs", "output", "prompt", "text", "token_ids"]
    # a name the record lacks but a record can hold selects nothing, as documented
    kept = api.client().get(f"/v1/records/{rid}/evidence", params={"redact": "choices[7].text"})
    assert kept.status_code == 200 and len(kept.json()["disclosures"]) == len(encoded)


def test_ingest_refuses_a_reused_salt_and_content_in_the_clear(api: Harness):
    key, fp = api.setup_collector()
    v1 = record_body(fp)
    salt = "c2FsdHNhbHRzYWx0c2FsdA"  # "saltsaltsaltsalt", for every member
    made = [disclosures.make(m, v, salt) for m, v in content_members(v1).items()]
    body, _ = commit_record(v1)
    body["disclosure_digests"] = sorted(d.digest for d in made)
    envelope = sign_envelope(RECORD_KIND, body, key).to_dict()
    err = assert_error(_post(api, envelope, [d.encoded for d in made]), 422, "invalid_disclosure")
    assert err["details"]["check"] == "salt"

    v1 = record_body(fp)
    v1["timings"] = {**v1["timings"], "debug_prompt": "Patient Jane Roe, HIV positive"}
    body, encoded = commit_record(v1)
    envelope = sign_envelope(RECORD_KIND, body, key).to_dict()
    err = assert_error(_post(api, envelope, encoded), 422, "schema_violation")
    assert err["details"] == {"field": "timings", "item": 0}
    missing = api.client().get(f"/v1/records/{body['request_id']}")
    assert missing.status_code == 404


def test_a_redacted_bundle_of_a_schema_v1_record_is_refused_not_served_whole(api: Harness):
    """A v1 record's content is inside its signed envelope: a bundle asked for without the
    prompt would carry it anyway, so the ledger refuses (and says why) instead of serving
    the whole bundle under the name of a redacted one."""
    key, fp = api.setup_collector()
    env = sign_envelope(RECORD_KIND, record_body(fp, text_prompt=True), key)
    assert _post(api, env.to_dict(), []).status_code == 201
    rid = env.body["request_id"]
    for redact in ("prompt", "choices[0].text", "output,request_raw"):
        err = assert_error(
            api.client().get(f"/v1/records/{rid}/evidence", params={"redact": redact}),
            409,
            "not_redactable",
        )
        assert err["details"]["request_id"] == rid
        assert "schema v1" in err["message"]
    whole = api.client().get(f"/v1/records/{rid}/evidence")
    assert whole.status_code == 200 and whole.json()["disclosures"] == []
