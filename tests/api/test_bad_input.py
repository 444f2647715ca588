"""Bad input and resources, over real HTTP on both backends: the token and the size limit come
before a body is read, slow and short bodies time out, 405 names what is allowed, the OpenAPI
document declares the bearer scheme and the limits, types are strict, weak keys are refused.
(Random input over every route: test_bad_input_fuzz.py.)"""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from api.routes.workers import HEARTBEAT_MAX_BYTES
from ledger.certify import MAX_CONCURRENCY, MAX_TOKENS
from ledger.clock import rfc3339
from ledger.errors import InvalidInput
from ledger.heartbeat import build_heartbeat
from ledger.key_scope import MAX_POOLS
from ledger.signing import public_key_pem
from ledger.storage.tokenstore import prepare_token
from tests.support.documents import fingerprint_body, record_body, resign
from tests.support.harness import MAX_BATCH, MAX_BODY, Harness
from tests.support.http import assert_error
from tests.support.rawhttp import RawAnswer, chunked, exchange, flood

MiB = 1 << 20
HUGE = 100 * MiB
# Every route that takes a POST (the list is checked against the OpenAPI document below).
POST_ROUTES = [
    "/v1/keys",
    "/v1/keys/ed25519:x/revoke",
    "/v1/fingerprints",
    "/v1/records",
    "/v1/workers",
    "/v1/replays",
    "/v1/cache/key",
    "/v1/cache/lookup",
    "/v1/certifications",
    "/v1/certifications/cert-x/cancel",
    "/v1/log/checkpoint",
    "/v1/records/req-x/erasure",
    "/v1/erasures",
    "/v1/holds",
]
# Sent before the answer came: what the kernel's socket buffers took, never the body.
UNREAD = 16 * MiB
JSON = {"content-type": "application/json"}


def _auth(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


def _huge(api: Harness, path: str, headers: dict[str, str]) -> RawAnswer:
    return exchange(
        api.url, "POST", path, {**JSON, "content-length": str(HUGE), **headers}, flood(HUGE)
    )


def _spec(api: Harness) -> dict[str, Any]:
    spec: dict[str, Any] = api.client(token=None).get("/openapi.json").json()
    return spec


def test_the_post_routes_listed_here_are_every_post_route(api: Harness):
    posts = {
        path.replace("{key_id}", "ed25519:x")
        .replace("{request_id}", "req-x")
        .replace("{certification_id}", "cert-x")
        for path, ops in _spec(api)["paths"].items()
        if "post" in ops
    }
    assert posts == set(POST_ROUTES)


@pytest.mark.parametrize("path", POST_ROUTES)
def test_an_unauthenticated_100_mib_body_is_refused_before_it_is_read(api: Harness, path: str):
    answer = _huge(api, path, {})
    assert answer.status == 401 and answer.code == "missing_token"
    assert answer.headers["www-authenticate"] == "Bearer"
    # the answer came while the client was still sending: the server never read the body
    assert answer.sent < UNREAD, answer.sent
    assert answer.headers["connection"] == "close" and answer.closed
    bad = _huge(api, path, _auth("lgr_not-a-token"))
    assert bad.status == 401 and bad.code == "invalid_token" and bad.sent < UNREAD


@pytest.mark.parametrize("path", POST_ROUTES)
def test_a_token_without_the_scope_is_refused_before_the_body(api: Harness, path: str):
    required = {
        p.replace("{key_id}", "ed25519:x")
        .replace("{request_id}", "req-x")
        .replace("{certification_id}", "cert-x"): ops["post"]["x-required-scope"]
        for p, ops in _spec(api)["paths"].items()
        if "post" in ops
    }[path]
    wrong = "records:read" if required in ("replay", "records:write") else "replay"
    answer = _huge(api, path, _auth(api.token(wrong)))
    assert answer.status == 403 and answer.code == "insufficient_scope"
    assert answer.json()["error"]["details"]["required"] == required
    assert answer.sent < UNREAD and answer.closed


@pytest.mark.parametrize("path", POST_ROUTES)
def test_a_declared_oversized_body_is_413_before_it_is_read(api: Harness, path: str):
    answer = _huge(api, path, _auth(api.admin_token))
    assert answer.status == 413 and answer.code == "body_too_large"
    assert answer.json()["error"]["details"]["limit"] == MAX_BODY
    assert answer.sent < UNREAD and answer.closed


@pytest.mark.parametrize("path", POST_ROUTES)
def test_a_chunked_body_is_counted_as_it_arrives(api: Harness, path: str):
    headers = {**JSON, "transfer-encoding": "chunked", **_auth(api.admin_token)}
    answer = exchange(api.url, "POST", path, headers, chunked(flood(HUGE)))
    # a route that reads no body answers without reading it (a checkpoint, or the malformed ID)
    no_body = {"/v1/log/checkpoint": (200, 404), "/v1/certifications/cert-x/cancel": (422,)}
    if path in no_body:
        assert answer.status in no_body[path] and answer.closed
        assert answer.sent < UNREAD
        return
    assert answer.status == 413 and answer.code == "body_too_large", answer.body
    # refused once the count passed the limit (a route's own may be lower), long before the
    # client's 100 MiB
    assert answer.sent < MAX_BODY + UNREAD
    assert answer.closed


def test_a_body_on_an_unknown_path_is_not_read(api: Harness):
    assert _huge(api, "/v1/nothing", {}).status == 413  # the declared size is refused first
    headers = {**JSON, "transfer-encoding": "chunked"}
    answer = exchange(api.url, "POST", "/v1/nothing", headers, chunked(flood(HUGE)))
    assert answer.status == 404 and answer.sent < UNREAD and answer.closed


@pytest.fixture
def short_deadline(api: Harness, monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(api.settings, "body_timeout", 1.0)
    return 1.0


@pytest.mark.parametrize("path", ["/v1/records", "/v1/keys", "/v1/replays"])
def test_a_body_shorter_than_its_length_times_out(api: Harness, short_deadline: float, path: str):
    headers = {**JSON, "content-length": "1000", **_auth(api.admin_token)}
    answer = exchange(api.url, "POST", path, headers, [b'{"envelopes": ['], timeout=10)
    assert answer.status == 408 and answer.code == "body_timeout"
    assert answer.json()["error"]["details"]["timeout_seconds"] == short_deadline
    assert short_deadline - 0.1 <= answer.elapsed < short_deadline + 5  # 5: a loaded host
    assert answer.headers["connection"] == "close" and answer.closed


def test_a_trickled_body_times_out_on_its_total_time(api: Harness, short_deadline: float):
    headers = {**JSON, "content-length": "1000", **_auth(api.admin_token)}
    trickle = [b" "] * 40  # one byte every 0.1 s: each wait is short, their sum is not
    answer = exchange(api.url, "POST", "/v1/records", headers, trickle, pause=0.1, timeout=10)
    assert answer.status == 408 and answer.code == "body_timeout"
    assert answer.sent < 25 and answer.closed


def test_a_complete_body_is_not_timed_out_by_slow_work_after_it(api: Harness, short_deadline):
    key, fp = api.setup_collector()  # the deadline bounds waiting for the client only
    resp = api.post([api.record(key, fp) for _ in range(MAX_BATCH)])
    assert resp.status_code == 201, resp.text


def test_405_names_every_allowed_method(api: Harness):
    c = api.client()
    cases = {
        ("DELETE", "/v1/records"): {"GET", "HEAD", "POST"},  # two routes share the path
        ("PUT", "/v1/log/checkpoint"): {"GET", "HEAD", "POST"},
        ("PATCH", "/v1/keys/ed25519:x"): {"GET", "HEAD"},
        ("DELETE", "/v1/erasures"): {"POST"},
        ("HEAD", "/v1/erasures"): {"POST"},  # no GET here: no HEAD either
        ("GET", "/v1/cache/key"): None,  # GET /v1/cache/{key} serves it
    }
    for (method, path), allowed in cases.items():
        resp = c.request(method, path)
        if allowed is None:
            assert resp.status_code != 405
            continue
        if method == "HEAD":  # an answer without a body
            assert resp.status_code == 405 and resp.content == b""
        else:
            assert_error(resp, 405, "method_not_allowed")
        assert set(resp.headers["allow"].split(", ")) == allowed, resp.headers


def test_head_answers_as_get_without_a_body(api: Harness):
    """A load balancer's HEAD /healthz, or curl -I, got 405 on every route FastAPI serves."""
    c = api.client()
    anonymous = c.__class__(base_url=str(c.base_url))
    for client, path, status in (
        (anonymous, "/healthz", 200),
        (c, "/v1/records?limit=1", 200),
        (anonymous, "/v1/log/key", 200),
        (anonymous, "/v1/records", 401),  # the token is checked as for GET
        (c, "/v1/records/no-such-record", 404),
        (c, "/v1/records?modle=x", 422),
    ):
        head, get = client.head(path), client.get(path)
        assert (head.status_code, get.status_code) == (status, status), path
        assert head.content == b"" and get.content != b"", path
        assert head.headers["content-type"] == get.headers["content-type"], path
        assert head.headers.get("www-authenticate") == get.headers.get("www-authenticate")


def test_openapi_declares_the_bearer_scheme_on_exactly_the_protected_routes(api: Harness):
    spec = _spec(api)
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["bearer"]["description"],
    }
    anon = api.client(token=None)
    public = set()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            url = path.replace("{", "x").replace("}", "")  # any value for path parameters
            resp = anon.request(method.upper(), url)
            if op.get("security") == [{"bearer": []}]:
                assert_error(resp, 401, "missing_token")
                assert "401" in op["responses"]
                if path == "/v1/tokens/self":  # any valid token: no scope, no 403
                    assert "x-required-scope" not in op and "403" not in op["responses"]
                    assert "of any scope" in op["description"]
                    continue
                assert op["x-required-scope"] in op["description"] and "403" in op["responses"]
            else:
                assert "security" not in op and resp.status_code != 401, (method, path)
                assert "401" not in op["responses"]
                public.add(path)
    assert public == {"/healthz", "/metrics", "/v1/log/key"}


def test_openapi_states_the_real_limits(api: Harness):
    spec = _spec(api)
    info = spec["info"]["description"]
    assert f"{MAX_BODY} bytes" in info and f"{MAX_BATCH} envelopes" in info
    assert f"{api.settings.body_timeout:g} s" in info
    ingest = spec["paths"]["/v1/records"]["post"]
    assert f"at most {MAX_BATCH} records" in ingest["description"]
    schema = ingest["requestBody"]["content"]["application/json"]["schema"]
    # both forms of a batch, {"records": [...]} and {"envelopes": [...]}, are bounded
    assert [
        f["properties"][m]["maxItems"]
        for f, m in zip(schema["oneOf"], ("records", "envelopes"), strict=True)
    ] == [MAX_BATCH, MAX_BATCH]
    assert "properties" not in schema
    for path, ops in spec["paths"].items():
        for op in ops.values():
            if "requestBody" in op:
                limit = HEARTBEAT_MAX_BYTES if path == "/v1/workers" else MAX_BODY
                assert f"at most {limit} bytes" in op["description"], path
                assert {"408", "413"} <= set(op["responses"]), path
    # the heartbeat route's stated limit is the one it applies
    big = api.client().post(
        "/v1/workers",
        content=b'{"pad": "' + b"x" * HEARTBEAT_MAX_BYTES + b'"}',
        headers={"content-type": "application/json"},
    )
    assert_error(big, 413, "body_too_large")
    assert big.json()["error"]["details"]["limit"] == HEARTBEAT_MAX_BYTES
    keys = spec["paths"]["/v1/keys"]["post"]["requestBody"]["content"]["application/json"]
    assert set(keys["schema"]["properties"]) == {"name", "role", "public_key", "pools"}
    assert [
        f["properties"][m]["minItems"]
        for f, m in zip(schema["oneOf"], ("records", "envelopes"), strict=True)
    ] == [1, 1]

    # the bounds each route checks itself are stated, with the values it checks
    def body(path: str) -> dict[str, Any]:
        return spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]

    pools = body("/v1/keys")["properties"]["pools"]
    assert (pools["minItems"], pools["maxItems"], pools["uniqueItems"]) == (1, MAX_POOLS, True)
    assert re.fullmatch(pools["items"]["pattern"], "pool-a.1")
    assert not re.fullmatch(pools["items"]["pattern"], "pool a")
    certify = body("/v1/certifications")["properties"]
    assert certify["concurrency"]["items"]["maximum"] == MAX_CONCURRENCY
    assert certify["max_tokens"]["items"]["maximum"] == MAX_TOKENS
    hold = body("/v1/holds")["properties"]["request_id"]["pattern"]
    assert re.fullmatch(hold, "req-1:a") and not re.fullmatch(hold, "..")
    c = api.client()
    pem = public_key_pem(Ed25519PublicKey.from_public_bytes(bytes(range(2, 34))))
    for listed in ([], ["p"] * 2, [f"p{i}" for i in range(MAX_POOLS + 1)], ["pool a"]):
        key = {"name": "k", "role": "collector", "public_key": pem, "pools": listed}
        assert_error(c.post("/v1/keys", json=key), 422, "invalid_pools")
    holds = api.client(api.token("holds"))
    assert_error(
        holds.post("/v1/holds", json={"request_id": "..", "reason": "r"}), 422, "invalid_parameters"
    )
    assert_error(
        api.client(api.token("admin")).post(
            "/v1/certifications", json={"pool": "p", "concurrency": [MAX_CONCURRENCY + 1]}
        ),
        422,
        "invalid_parameters",
    )


def test_openapi_states_the_real_answers(api: Harness):
    """The heartbeat schema refused the spool_pending collectors send; 200 on a repeated
    registration, 405, 500, 502, the health check's 503 and a streamed hit were undeclared."""
    spec = _spec(api)
    body_schema = spec["paths"]["/v1/workers"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]["properties"]["body"]
    sent = build_heartbeat(
        worker_id="w1", pool="p", url="http://127.0.0.1:1", fingerprint_id="sha256:" + "0" * 64,
        spool_pending=3,
    )  # fmt: skip
    jsonschema.validate(sent, body_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**sent, "spool_pending": -1}, body_schema)
    paths = spec["paths"]
    for path, method in (
        ("/v1/keys", "post"),
        ("/v1/fingerprints", "post"),
        ("/v1/records", "post"),
        ("/v1/records/{request_id}/erasure", "post"),
    ):
        assert {"200", "201"} <= set(paths[path][method]["responses"]), path
    assert {"405", "500"} <= set(paths["/v1/records"]["get"]["responses"])
    assert "502" in paths["/v1/replays"]["post"]["responses"]
    assert "503" in paths["/healthz"]["get"]["responses"]
    lookup = paths["/v1/cache/lookup"]["post"]["responses"]["200"]["content"]
    assert {"application/json", "text/event-stream"} <= set(lookup)


# ---- strict types -------------------------------------------------------------------------


@pytest.mark.parametrize("version", [True, 1.0, "1"])
def test_a_schema_version_must_be_the_integer_1(api: Harness, version: Any):
    key, fp = api.setup_collector()
    body = record_body(fp)
    body["schema_version"] = version
    assert_error(api.post([resign(key, body)]), 422, "unsupported_schema_version")
    fp_body = {**fingerprint_body(), "schema_version": version}
    resp = api.client().post("/v1/fingerprints", json=resign(key, fp_body, kind="fingerprint"))
    assert_error(resp, 422, "unsupported_schema_version")


def test_record_members_are_not_coerced(api: Harness):
    key, fp = api.setup_collector()
    for mutate in (
        lambda b: b.update(tier=True),
        lambda b: b["choices"][0].update(index=False),
        lambda b: b["choices"][0].update(stop_reason=True),
        lambda b: b["usage"].update(prompt_tokens=12.0),
        lambda b: b.update(aborted=0),
    ):
        body = record_body(fp)
        mutate(body)
        assert_error(api.post([resign(key, body)]), 422, "schema_violation")


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/v1/keys", {"name": 1, "role": "collector", "public_key": "x"}),
        ("/v1/keys", {"name": "a", "role": True, "public_key": "x"}),
        ("/v1/keys/ed25519:x/revoke", {"reason": 7}),
        ("/v1/replays", {"request_id": "r", "force": 1}),
        ("/v1/replays", {"request_id": 5}),
        ("/v1/cache/key", {"endpoint": "/v1/completions", "request": {}, "fingerprint_id": 1}),
        ("/v1/cache/lookup", {"endpoint": "/v1/completions", "request": {}, "pool": 1}),
        ("/v1/cache/lookup", {"endpoint": "/v1/completions", "request": [], "pool": "p"}),
        ("/v1/cache/lookup", {"endpoint": "/v1/completions", "request": {}, "pool": ""}),
        (
            "/v1/cache/key",
            {
                "endpoint": "/v1/completions",
                "request": {"prompt": "x"},
                "fingerprint_id": "sha256:" + "0" * 64,
                "prompt_token_ids": [True, 2],
            },
        ),
        ("/v1/certifications", {"pool": "p", "prompts": True}),
        ("/v1/certifications", {"pool": "p", "seed": 1.0}),
        ("/v1/certifications", {"pool": "p", "concurrency": [1, True]}),
    ],
)
def test_request_bodies_are_strict(api: Harness, path: str, payload: dict[str, Any]):
    err = assert_error(api.client().post(path, json=payload), 422, "schema_violation")
    assert err["details"]["errors"][0]["loc"][0] == "body"


@pytest.mark.parametrize(
    "raw",
    [b'{"reason": "a", "reason": "b"}', b'{"reason": NaN}', b"[" * 100_000, b"\xff\xfe{}"],
)
def test_every_body_is_strict_json(api: Harness, raw: bytes):
    resp = api.client().post("/v1/keys/ed25519:x/revoke", content=raw, headers=JSON)
    assert_error(resp, 400, "invalid_json")


def test_greedy_means_temperature_zero_not_false(api: Harness):
    _, fp = api.setup_collector()
    payload = {
        "endpoint": "/v1/completions",
        "request": {"prompt": "x", "temperature": False},
        "fingerprint_id": fp,
    }
    assert_error(api.client().post("/v1/cache/key", json=payload), 422, "invalid_request")


# ---- weak keys ----------------------------------------------------------------------------

P = 2**255 - 19
WEAK = [
    bytes(32),
    (1).to_bytes(32, "little"),
    (P - 1).to_bytes(32, "little"),
    (P + 1).to_bytes(32, "little"),
    bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"),
    bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"),
    bytes(31) + b"\x80",  # all-zero y with the sign bit set
]


@pytest.mark.parametrize("raw", WEAK, ids=lambda raw: raw.hex()[:8] + raw.hex()[-2:])
def test_small_order_keys_are_refused_at_registration(api: Harness, raw: bytes):
    c = api.client()
    for text in (
        "ed25519:" + base64.b64encode(raw).decode(),
        public_key_pem(Ed25519PublicKey.from_public_bytes(raw)),
    ):
        payload = {"name": "weak", "role": "collector", "public_key": text}
        assert_error(c.post("/v1/keys", json=payload), 422, "weak_public_key")
    encoded = base64.b64encode(raw).decode()
    assert all(encoded not in k["public_key"] for k in c.get("/v1/keys").json()["items"])


def test_a_key_text_that_is_no_key_is_422(api: Harness):
    c = api.client()
    for text in ("\ud800", "-----BEGIN PUBLIC KEY-----\ud800", "ed25519:" + "A" * 44):
        body = json.dumps({"name": "k", "role": "collector", "public_key": text})
        resp = c.post("/v1/keys", content=body.encode(), headers=JSON)
        assert_error(resp, 422, "invalid_public_key")


def test_a_body_that_is_not_utf8_is_400(api: Harness):
    """RFC 8259: JSON text is UTF-8. UTF-16 and UTF-32 (which Python's json would detect and
    decode), a byte order mark and surrogate code points encoded as bytes are refused."""
    payload = json.dumps({"name": "k16", "role": "collector", "public_key": "x"})
    c = api.client()
    for body in (
        payload.encode("utf-16"),
        payload.encode("utf-32-be"),
        b"\xef\xbb\xbf" + payload.encode(),
        b'{"\xed\xa0\x80": 1}',
    ):
        assert_error(c.post("/v1/keys", content=body, headers=JSON), 400, "invalid_json")
    assert all(k["name"] != "k16" for k in c.get("/v1/keys").json()["items"])


def test_a_filter_model_that_is_not_text_is_422(api: Harness):
    """JSON can escape a lone surrogate into a string: a search filter refuses it by name
    (it answered 500 from the database driver)."""
    c = api.client(api.token("erasure"))
    body = json.dumps({"filter": {"model": "\udc00"}, "reason": "x"}).encode()
    assert_error(c.post("/v1/erasures", content=body, headers=JSON), 422, "invalid_parameters")
    body = json.dumps({"filter": {"model": "\udc00"}, "reason": "x", "dry_run": False}).encode()
    assert_error(c.post("/v1/erasures", content=body, headers=JSON), 422, "invalid_parameters")
    body = json.dumps({"filter": {"model": "m\udc00"}, "reason": "x"}).encode()
    holds = api.client(api.token("holds"))
    assert_error(holds.post("/v1/holds", content=body, headers=JSON), 422, "invalid_parameters")


def test_an_unexpected_error_is_answered_with_the_request_id_and_keeps_the_connection(
    api: Harness, monkeypatch: pytest.MonkeyPatch
):
    """A bug answers the JSON 500 with the request's ID (support finds its traceback by it),
    and the connection stays usable: the exception is not raised on to the server."""
    from ledger.storage import checkpoints

    def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(checkpoints, "latest", broken)
    c = api.client()
    first = c.get("/v1/log/checkpoint", headers={"x-request-id": "support-case-17"})
    assert_error(first, 500, "internal_error")
    assert first.headers["x-request-id"] == "support-case-17"
    assert "a bug" not in first.text
    monkeypatch.undo()
    again = c.get("/v1/log/key")  # on the same pooled connection
    assert again.status_code == 200, again.text


def test_names_and_reasons_that_are_not_text_are_422(api: Harness):
    """A key's name is shown in bundles and the console, a reason is logged: NUL and other
    control characters are refused there, and nothing is registered or logged."""
    c = api.client()
    hidden = (
        "   ",
        "admin\u202e",
        "a\u200bb",
        "line\u2028two",
        "\u00a0",
        "\u0301",  # a combining mark alone
        "\u3164",  # a filler: a letter by category that shows nothing
        "\u2800",
        "\ue000",  # private use
    )
    for name in ("a\x00b", "tab\tname", "bell\x07", *hidden):
        pem = public_key_pem(Ed25519PublicKey.from_public_bytes(bytes(range(1, 33))))
        body = json.dumps({"name": name, "role": "collector", "public_key": pem}).encode()
        assert_error(c.post("/v1/keys", content=body, headers=JSON), 422, "schema_violation")
    assert all("\x00" not in k["name"] for k in c.get("/v1/keys").json()["items"])
    # a token's name is signed into the erasures it makes: the same rule
    for name in ("a\x00b", "esc\x1b[31m", *hidden):
        with pytest.raises(InvalidInput, match="token name"):
            prepare_token(name, ["records:read"])
    for name in ("ops team · café", "x\u0301", "\U0001f44d"):
        assert prepare_token(name, ["records:read"]).info.name == name
    # a reason is signed into the log and read later on terminals and pages: no control or
    # format character (an escape sequence, a bidirectional override), but tab and line breaks
    holds = api.client(api.token("holds"))
    before = holds.get("/v1/holds").json()["holds"]
    for reason in ("\x00", "esc\x1b[2J", "a\u202eb", "a\u200bb", "bell\x07"):
        body = json.dumps({"request_id": "req-x", "reason": reason}).encode()
        answer = holds.post("/v1/holds", content=body, headers=JSON)
        assert_error(answer, 422, "invalid_parameters")
    assert holds.get("/v1/holds").json()["holds"] == before
    placed = holds.post(
        "/v1/holds", json={"request_id": "req-layout", "reason": "ticket 88\r\n\tcafé · line two"}
    )
    assert placed.status_code == 201, placed.text


def test_a_name_nothing_can_have_is_422_on_every_database(api: Harness):
    """A NUL in a path ID was looked up by SQLite (404) and refused by Postgres (422
    rejected_by_database); a revocation reason with NUL was logged on SQLite. Every lookup by
    a name of the wrong form is now 422 invalid_parameters before any query, alike on both."""
    c = api.client()
    for path in (
        "/v1/keys/%00",
        "/v1/keys/ed25519:" + "0" * 63 + "%00",
        "/v1/fingerprints/%00",
        "/v1/fingerprints/sha256:" + "x" * 10_000,
        "/v1/pools/a%00b",
        "/v1/replays/%00",
        "/v1/certificates/" + "c" * 201,
    ):
        resp = c.get(path)
        assert_error(resp, 422, "invalid_parameters")
        assert len(resp.text) < 1000, path  # the 10 KB name is not echoed back
    key, _ = api.setup_collector()
    for reason in ("a\x00\x1b[31m", "", " "):
        body = json.dumps({"reason": reason}).encode()
        assert_error(
            c.post(f"/v1/keys/{key.key_id}/revoke", content=body, headers=JSON),
            422,
            "schema_violation" if reason == "" else "invalid_parameters",
        )
    assert_error(c.post("/v1/keys/%00/revoke", json={"reason": "x"}), 422, "invalid_parameters")
    assert c.get(f"/v1/keys/{key.key_id}").json()["revoked"] is False
    certify = api.client(api.token("admin"))
    assert_error(
        certify.post("/v1/certifications", json={"pool": "a\x00"}), 422, "invalid_parameters"
    )
    assert_error(
        c.post(
            "/v1/cache/lookup",
            json={"endpoint": "/v1/completions", "pool": "a\x00b", "request": {"prompt": "x"}},
        ),
        422,
        "invalid_parameters",
    )


@pytest.mark.parametrize(
    ("ctype", "status"),
    [
        ("Application/JSON", 200),
        ("APPLICATION/JSON; charset=UTF-8", 200),
        ('application/json; charset="utf-8"', 200),
        ("application/json; charset=utf-16", 400),
        ("application/json; charset=latin-1", 400),
        ("text/plain", 400),
    ],
)
def test_the_media_type_is_read_without_case_and_only_utf8_is_json(
    api: Harness, ctype: str, status: int
):
    """RFC 9110: a media type is case-insensitive; RFC 8259: JSON is UTF-8, so a body said to
    be in another charset (and then decoded as UTF-8 anyway) is refused."""
    key = api.collector()
    body = json.dumps({"reason": "media type test"}).encode()
    resp = api.client().post(
        f"/v1/keys/{key.key_id}/revoke", content=body, headers={"content-type": ctype}
    )
    if status == 200:
        assert resp.status_code == 200 and resp.json()["revoked"] is True, resp.text
    else:
        assert_error(resp, 400, "invalid_json")


def test_a_query_parameter_the_route_does_not_take_is_422_not_ignored(api: Harness):
    """A misspelt search filter answered every record (the filter was ignored); a repeated
    parameter and an integer written as 1.0 were taken. Each is 422 schema_violation naming
    the parameter, as a body member would be."""
    c = api.client()
    for query, name in (
        ("modle=nothing", "modle"),
        ("limit=1&limit=5", "limit"),
        ("limit=1.0", "limit"),
        ("limit=", "limit"),
        ("model=a&model=b", "model"),
        ("limit=%2B2", "limit"),
        ("limit=%202", "limit"),
        ("aborted=yes", "aborted"),
        ("held=1", "held"),
        ("aborted=True", "aborted"),
    ):
        err = assert_error(c.get(f"/v1/records?{query}"), 422, "schema_violation")
        assert err["details"]["errors"][0]["loc"] == ["query", name], query
    assert c.get("/v1/records?limit=2&model=nothing").status_code == 200
    assert c.get("/v1/records?aborted=false&held=true").status_code == 200
    err = assert_error(
        c.get("/v1/log/proof/inclusion?index=0&tree_size=1&x=1"), 422, "schema_violation"
    )
    assert "index" in err["message"] and "tree_size" in err["message"]
    # a route that takes no query at all
    assert_error(c.get("/v1/log/checkpoint?verbose=1"), 422, "schema_violation")
    # the token is still checked first
    assert c.__class__(base_url=str(c.base_url)).get("/v1/records?modle=x").status_code == 401


def test_the_same_mistake_gets_the_same_answer_on_every_route(api: Harness):
    """A dry run took a blank reason the run refuses; a pool name no pool can have was
    unknown_pool on replays only; a certification ID of the wrong form was a 404 echoing it;
    a trailing slash was an empty 307 to a URL built from the Host header, before the token."""
    c = api.client()
    for body in (
        {"filter": {}, "reason": " "},
        {"filter": {"model": "no-such-model"}, "reason": "a\x00b"},
        {"filter": {}, "reason": " ", "dry_run": False},
    ):
        assert_error(c.post("/v1/erasures", json=body), 422, "invalid_parameters")
    for pool in ("bad/pool", "p" * 101, "a\x00"):
        assert_error(
            c.post("/v1/replays", json={"request_id": "r1", "pool": pool}),
            422,
            "invalid_parameters",
        )
    for job in ("a%00b", "cert-" + "0" * 5000, "x"):
        resp = c.get(f"/v1/certifications/{job}")
        assert_error(resp, 422, "invalid_parameters")
        assert len(resp.text) < 1000
    assert_error(c.get("/v1/certifications/cert-" + "0" * 32), 404, "job_not_found")
    anonymous = c.__class__(base_url=str(c.base_url))
    for client in (c, anonymous):
        for method, path in (("GET", "/v1/keys/"), ("POST", "/v1/records/"), ("GET", "/healthz/")):
            resp = client.request(method, path, headers={"host": "evil.example"})
            assert_error(resp, 404, "not_found")
            assert "location" not in resp.headers


@pytest.mark.parametrize(
    "started",
    [
        "2026-W01-1T00:00:00Z",  # an ISO week date
        "2026-12-02T09:00Z",  # no seconds
        "2026-12-02T09:00:00",  # no zone
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:59:59-14:00",  # after year 9999 in UTC
        "2026-02-30T00:00:00Z",
    ],
)
def test_a_start_time_that_is_not_rfc_3339_is_refused(api: Harness, started: str):
    """Python's fromisoformat took week dates, spaces and instants outside years 1-9999 in
    UTC, and a cache hit served them as its `created` (-62135600400 for year 0)."""
    key, fp = api.setup_collector()
    body = record_body(fp)
    body["timings"]["started_at"] = started
    err = assert_error(api.post([resign(key, body)]), 422, "schema_violation")
    assert err["message"].startswith("timings.started_at")


def test_a_record_that_starts_after_the_ledger_received_it_waits(api: Harness):
    """Received more than a minute before it started (its collector's clock runs ahead): the
    audit would report its receive time as moved back, so ingest holds it off (503: every
    shipper, of any version, retries) until the ledger's clock catches up."""
    key, fp = api.setup_collector()
    now = datetime.now(UTC)
    body = record_body(fp)
    body["timings"]["started_at"] = rfc3339(now + timedelta(minutes=5))
    resp = api.post([resign(key, body)])
    err = assert_error(resp, 503, "record_from_the_future")
    assert err["details"]["item"] == 0 and "clock" in err["message"]
    assert 235 <= int(resp.headers["retry-after"]) <= 241
    assert api.client().get(f"/v1/records/{body['request_id']}").status_code == 404
    for started in (now + timedelta(seconds=30), now - timedelta(days=30)):
        body = record_body(fp)
        body["timings"]["started_at"] = rfc3339(started)
        assert api.post([resign(key, body)]).status_code == 201
    body = record_body(fp)
    body["timings"]["started_at"] = "2026-12-02T09:00:00.123456789+01:00"  # nanoseconds: read
    assert api.post([resign(key, body)]).status_code == 201
