"""Auth, keys, fingerprints and operations endpoints over real HTTP, on both backends."""

from __future__ import annotations

import pytest

from ledger.fingerprint import fingerprint_id
from ledger.signing import Envelope, SigningKey, public_key_pem, verify_envelope
from tests.support.documents import fingerprint_envelope, resign
from tests.support.harness import Harness
from tests.support.http import assert_error


def test_no_token_is_401_and_wrong_scope_is_403(api: Harness):
    anon = api.client(token=None)
    resp = anon.get("/v1/records/x")
    assert_error(resp, 401, "missing_token")
    assert resp.headers["www-authenticate"] == "Bearer"
    assert_error(api.client(token="lgr_not-a-token").get("/v1/records/x"), 401, "invalid_token")
    bad_scheme = api.client(token=None).get("/v1/records/x", headers={"Authorization": "Basic abc"})
    assert_error(bad_scheme, 401, "invalid_token")

    reader = api.client(api.token("records:read"))
    key, fp = api.setup_collector()
    err = assert_error(
        reader.post("/v1/records", json={"envelopes": [api.record(key, fp).to_dict()]}),
        403,
        "insufficient_scope",
    )
    assert err["details"]["required"] == "records:write"
    writer = api.client(api.token("records:write"))
    assert_error(writer.get("/v1/records/x"), 403, "insufficient_scope")
    assert_error(
        writer.post(
            "/v1/keys", json={"name": "x", "role": "collector", "public_key": "ed25519:AAAA"}
        ),
        403,
        "insufficient_scope",
    )
    resp = writer.post("/v1/records", json={"envelopes": [api.record(key, fp).to_dict()]})
    assert resp.status_code == 201


def test_revoked_token_is_refused(api: Harness):
    from ledger.storage import tokenstore

    secret, info = tokenstore.create_token(api.db, "short-lived", ["records:read"])
    c = api.client(secret)
    assert c.get("/v1/keys").status_code == 200
    tokenstore.revoke_token(api.db, info.token_id)
    assert_error(c.get("/v1/keys"), 401, "invalid_token")


def test_key_registration_is_idempotent_and_conflicts_are_named(api: Harness):
    key = SigningKey.generate()
    c = api.client()
    payload = {
        "name": "collector-a",
        "role": "collector",
        "public_key": public_key_pem(key.public_key),
    }
    first = c.post("/v1/keys", json=payload)
    assert first.status_code == 201
    assert first.json()["key_id"] == key.key_id
    assert c.post("/v1/keys", json=payload).status_code == 200
    err = assert_error(c.post("/v1/keys", json={**payload, "name": "other"}), 409, "key_conflict")
    assert err["details"]["key_id"] == key.key_id
    assert_error(c.post("/v1/keys", json={**payload, "role": "log"}), 422, "invalid_role")
    assert_error(
        c.post("/v1/keys", json={**payload, "public_key": "nope"}), 422, "invalid_public_key"
    )
    assert_error(c.post("/v1/keys", json={"name": "x"}), 422, "schema_violation")
    listed = {k["key_id"]: k for k in c.get("/v1/keys").json()["items"]}
    assert listed[key.key_id]["name"] == "collector-a"
    assert listed[api.log_key.key_id]["role"] == "log"
    assert_error(
        c.post("/v1/keys/ed25519:nope/revoke", json={"reason": "x"}), 422, "invalid_parameters"
    )
    unknown = "ed25519:" + "ab" * 32
    assert_error(c.post(f"/v1/keys/{unknown}/revoke", json={"reason": "x"}), 404, "key_not_found")
    revoked = c.post(f"/v1/keys/{key.key_id}/revoke", json={"reason": "rotated"}).json()
    assert revoked["revoked"] and revoked["revocation_reason"] == "rotated"
    assert c.get(f"/v1/keys/{key.key_id}").json()["revoked"] is True


def test_fingerprints(api: Harness):
    key = api.collector()
    env = fingerprint_envelope(key, name="fp-model")
    c = api.client()
    first = c.post("/v1/fingerprints", content=env.canonical)
    assert first.status_code == 201
    fp_id = first.json()["fingerprint_id"]
    assert fp_id == fingerprint_id(env.body)
    assert c.post("/v1/fingerprints", content=env.canonical).status_code == 200
    got = c.get(f"/v1/fingerprints/{fp_id}").json()
    back = Envelope.from_dict(got["envelope"])
    verify_envelope(back, key.public_key)
    assert back.canonical == env.canonical
    assert_error(c.get("/v1/fingerprints/sha256:" + "0" * 64), 404, "fingerprint_not_found")
    assert_error(
        c.post(
            "/v1/fingerprints", json=resign(key, {"schema_version": 1, "model": {}}, "fingerprint")
        ),
        422,
        "schema_violation",
    )
    assert_error(
        c.post("/v1/fingerprints", json=resign(SigningKey.generate(), env.body, "fingerprint")),
        422,
        "unknown_key",
    )
    tampered = env.to_dict()
    tampered["body"]["model"]["name"] = "other"
    assert_error(c.post("/v1/fingerprints", json=tampered), 422, "bad_signature")


def test_a_replayer_key_cannot_sign_records(api: Harness):
    _, fp = api.setup_collector()
    replayer = api.collector(role="replayer")
    assert_error(api.post([api.record(replayer, fp)]), 422, "key_role_not_allowed")


def test_health_metrics_openapi(api: Harness):
    anon = api.client(token=None)
    health = anon.get("/healthz").json()
    assert health["status"] == "ok" and health["database"] == api.db.dialect
    key, fp = api.setup_collector()
    api.post([api.record(key, fp)])
    metrics = anon.get("/metrics").text
    assert 'ledger_records_ingested_total{status="created"}' in metrics
    assert 'ledger_http_requests_total{method="POST",route="/v1/records",status="201"}' in metrics
    spec = anon.get("/openapi.json").json()
    for path in ("/v1/keys", "/v1/fingerprints", "/v1/records", "/v1/records/{request_id}"):
        assert path in spec["paths"]
    assert "requestBody" in spec["paths"]["/v1/records"]["post"]
    changes = {
        (p, m) for p, ops in spec["paths"].items() for m in ops if m in ("put", "patch", "delete")
    }
    assert changes == {("/v1/holds/{hold_id}", "delete")}, (
        "the ledger has no update or delete routes but a hold's release (a logged event)"
    )


def test_unknown_route_and_method_use_the_error_format(api: Harness):
    c = api.client()
    assert_error(c.get("/v1/nothing"), 404, "not_found")
    assert_error(c.delete("/v1/records"), 405, "method_not_allowed")


@pytest.mark.parametrize("scope", ["records:read", "admin"])
def test_search_is_readable_with_read_or_admin(api: Harness, scope: str):
    assert api.client(api.token(scope)).get("/v1/records", params={"limit": 1}).status_code == 200
