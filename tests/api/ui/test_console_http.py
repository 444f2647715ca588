"""The console over plain HTTP: sign-in and sessions, CSRF, scopes, exports, and the attacks a
page invites (forged or expired cookies, a revoked token, open redirects, cross-site posts)."""

from __future__ import annotations

import csv
import html
import io
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from api.ui.session import Sessions, session_key
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.signing import sign_envelope
from ledger.storage import tokenstore
from ledger.storage.audit import audit
from tests.api.test_read_paths import superuser
from tests.support.documents import record_body, record_v2
from tests.support.harness import MAX_BODY, Harness, start_harness


@dataclass
class Scene:
    h: Harness
    rid: str  # a v2 record
    fp: str


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    d = tmp_path_factory.mktemp("console")
    h = start_harness("sqlite", f"sqlite:///{d}/ledger.db", d)
    key, fp = h.setup_collector()
    rid = ""
    for i in range(3):
        env, disclosures = record_v2(key, fp, text_prompt=True, top_k=3, seed=i)
        resp = h.client().post(
            "/v1/records",
            json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]},
        )
        assert resp.status_code == 201, resp.text
        rid = env.body["request_id"]
    assert h.client().post("/v1/log/checkpoint").status_code == 200
    yield Scene(h, rid, fp)
    h.close()


def browser(scene: Scene) -> httpx.Client:
    return httpx.Client(base_url=scene.h.url, follow_redirects=False, timeout=30)


def sign_in(scene: Scene, secret: str, next_path: str = "/ui/records") -> httpx.Client:
    c = browser(scene)
    form = c.get("/ui/signin")
    token = re.search(r'name="form_token" value="([^"]+)"', form.text)
    assert token is not None
    resp = c.post("/ui/signin", data={"form_token": token[1], "next": next_path, "token": secret})
    assert resp.status_code == 303, resp.text
    return c


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found[1]


def test_pages_need_a_session(scene: Scene):
    c = browser(scene)
    for path in ("/ui/records", f"/ui/records/{scene.rid}", "/ui/log", "/ui/pools"):
        resp = c.get(path)
        assert resp.status_code == 303
        assert resp.headers["location"].startswith("/ui/signin?next=%2Fui%2F")
    # what the page's script fetches is refused too, never served
    assert c.get(f"/ui/records/{scene.rid}/evidence.json").status_code == 401
    assert c.get("/ui/records.csv").status_code == 401


def test_sign_in_sets_a_strict_http_only_session(scene: Scene):
    c = browser(scene)
    form = c.get("/ui/signin")
    token = re.search(r'name="form_token" value="([^"]+)"', form.text)
    assert token is not None
    resp = c.post(
        "/ui/signin", data={"form_token": token[1], "next": "/ui/log", "token": scene.h.admin_token}
    )
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/log"
    cookie = next(v for v in resp.headers.get_list("set-cookie") if v.startswith("ledger_session="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui/" in cookie
    assert "Max-Age=28800" in cookie
    assert "Secure" not in cookie  # plain HTTP here; set when the console is reached over HTTPS
    assert scene.h.admin_token not in cookie  # the session names the token, never its secret
    page = c.get("/ui/log")
    assert page.status_code == 200 and "Checkpoint history" in page.text
    for header in ("content-security-policy", "x-frame-options", "referrer-policy"):
        assert header in page.headers
    assert "default-src 'self'" in page.headers["content-security-policy"]
    # the assets too: never sniffed into another type, never framed, revalidated when kept
    for asset in ("verify.js", "console.js", "style.css"):
        got = c.get(f"/ui/static/{asset}")
        assert got.status_code == 200
        assert got.headers["x-content-type-options"] == "nosniff"
        assert got.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in got.headers["content-security-policy"]
        assert got.headers["cache-control"] == "no-cache"


def test_the_session_cookie_is_secure_behind_a_tls_proxy(scene: Scene):
    # A TLS proxy on this host says https with X-Forwarded-Proto (uvicorn takes it from the
    # addresses in FORWARDED_ALLOW_IPS, 127.0.0.1 by default): the cookie is then Secure.
    c = browser(scene)
    c.headers["X-Forwarded-Proto"] = "https"
    form = c.get("/ui/signin")
    token = re.search(r'name="form_token" value="([^"]+)"', form.text)
    assert token is not None
    signin_cookie = next(
        v for v in form.headers.get_list("set-cookie") if v.startswith("ledger_signin=")
    )
    assert "; Secure" in signin_cookie
    # the client itself talks plain HTTP to the proxy's upstream: it sends the cookie back
    c.cookies.clear()
    resp = c.post(
        "/ui/signin",
        data={"form_token": token[1], "next": "/ui/log", "token": scene.h.admin_token},
        headers={"Cookie": signin_cookie.split(";", 1)[0]},
    )
    assert resp.status_code == 303, resp.text
    cookie = next(v for v in resp.headers.get_list("set-cookie") if v.startswith("ledger_session="))
    assert "; Secure" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie


@pytest.mark.parametrize(
    ("secret", "status", "shown"),
    [
        ("lgr_not-a-token", 401, "not valid"),
        ("", 401, "enter an API token"),
    ],
)
def test_a_bad_token_is_refused_on_the_form(scene: Scene, secret: str, status: int, shown: str):
    c = browser(scene)
    form = c.get("/ui/signin")
    token = re.search(r'name="form_token" value="([^"]+)"', form.text)
    assert token is not None
    resp = c.post("/ui/signin", data={"form_token": token[1], "next": "", "token": secret})
    assert resp.status_code == status and shown in resp.text
    assert "ledger_session" not in resp.headers.get("set-cookie", "")


def test_a_token_without_records_read_cannot_sign_in(scene: Scene):
    c = browser(scene)
    form = c.get("/ui/signin")
    token = re.search(r'name="form_token" value="([^"]+)"', form.text)
    assert token is not None
    writer = scene.h.token("records:write")
    resp = c.post("/ui/signin", data={"form_token": token[1], "next": "", "token": writer})
    assert resp.status_code == 403 and "records:read" in resp.text


def test_the_sign_in_form_needs_its_own_token_and_cookie(scene: Scene):
    c = browser(scene)
    c.get("/ui/signin")
    resp = c.post("/ui/signin", data={"form_token": "forged", "token": scene.h.admin_token})
    assert resp.status_code == 403 and "csrf_failed" in resp.text
    fresh = browser(scene)  # a form token without its cookie (posted from another browser)
    form = c.get("/ui/signin")
    token = re.search(r'name="form_token" value="([^"]+)"', form.text)
    assert token is not None
    resp = fresh.post("/ui/signin", data={"form_token": token[1], "token": scene.h.admin_token})
    assert resp.status_code == 403


@pytest.mark.parametrize(
    "target",
    [
        "https://evil.example/",
        "//evil.example/ui/",
        "/ui/\\evil",
        "/v1/records",
        "",
        "/ui/../../v1/tokens",
        "/ui/%2e%2e/v1/tokens",
        "/ui/./%2E%2E/x",
    ],
)
def test_sign_in_never_redirects_off_the_console(scene: Scene, target: str):
    c = browser(scene)
    form = c.get("/ui/signin")
    token = re.search(r'name="form_token" value="([^"]+)"', form.text)
    assert token is not None
    resp = c.post(
        "/ui/signin", data={"form_token": token[1], "next": target, "token": scene.h.admin_token}
    )
    assert resp.headers["location"] == "/ui/records"


def test_forged_and_expired_cookies_are_refused(scene: Scene):
    c = sign_in(scene, scene.h.admin_token)
    good = c.cookies["ledger_session"]
    token_id, expires, nonce, mac = good.split(".")
    sessions = Sessions(session_key(scene.h.log_key), 60)
    other = tokenstore.create_token(scene.h.db, "other", ["records:read"])[1].token_id
    expired, _ = sessions.issue(token_id, now=0)
    for forged in (
        f"{other}.{expires}.{nonce}.{mac}",  # another token under this MAC
        f"{token_id}.{int(expires) + 10**6}.{nonce}.{mac}",  # a longer life
        f"{token_id}.{expires}.{nonce}.{mac[:-2]}AA",
        expired,
        "garbage",
    ):
        fake = browser(scene)
        fake.cookies.set("ledger_session", forged, domain="127.0.0.1", path="/ui/")
        assert fake.get("/ui/records").status_code == 303, forged
    # a cookie minted under another ledger's log key
    from ledger.signing import SigningKey

    foreign, _ = Sessions(session_key(SigningKey.generate()), 60).issue(token_id)
    fake = browser(scene)
    fake.cookies.set("ledger_session", foreign, domain="127.0.0.1", path="/ui/")
    assert fake.get("/ui/records").status_code == 303


def test_revoking_the_token_ends_its_sessions(scene: Scene):
    secret, info = tokenstore.create_token(scene.h.db, "leaver", ["records:read"])
    c = sign_in(scene, secret)
    assert c.get("/ui/records").status_code == 200
    tokenstore.revoke_token(scene.h.db, info.token_id)
    assert c.get("/ui/records").status_code == 303


def test_a_reader_sees_no_action_and_cannot_post_one(scene: Scene):
    reader = sign_in(scene, scene.h.token("records:read"))
    page = reader.get(f"/ui/records/{scene.rid}")
    assert page.status_code == 200
    assert "Erase content" not in page.text and "Place legal hold" not in page.text
    resp = reader.post(
        f"/ui/records/{scene.rid}/hold", data={"csrf": csrf_of(page.text), "reason": "x"}
    )
    assert resp.status_code == 403 and "insufficient_scope" in resp.text


def test_state_changing_forms_need_the_csrf_token(scene: Scene):
    admin = sign_in(scene, scene.h.admin_token)
    page = admin.get(f"/ui/records/{scene.rid}")
    assert "Erase content" in page.text and "Place legal hold" in page.text
    url = f"/ui/records/{scene.rid}/hold"
    assert admin.post(url, data={"reason": "x"}).status_code == 403
    assert admin.post(url, data={"csrf": "forged", "reason": "x"}).status_code == 403
    cross = admin.post(
        url,
        data={"csrf": csrf_of(page.text), "reason": "x"},
        headers={"Origin": "https://evil.example"},
    )
    assert cross.status_code == 403
    as_json = admin.post(url, json={"csrf": csrf_of(page.text), "reason": "x"})
    assert as_json.status_code == 422 and "form_expected" in as_json.text
    assert admin.post("/ui/signout", data={"csrf": ""}).status_code == 403
    holds = scene.h.client().get("/v1/holds").json()["holds"]
    assert not [h for h in holds if h["request_id"] == scene.rid]  # none of these placed one
    done = admin.post(url, data={"csrf": csrf_of(page.text), "reason": "litigation"})
    assert done.status_code == 303
    holds = scene.h.client().get("/v1/holds").json()["holds"]
    assert [h for h in holds if h["request_id"] == scene.rid]
    assert "under legal hold" in admin.get(f"/ui/records/{scene.rid}").text


def test_sign_out_clears_the_session(scene: Scene):
    c = sign_in(scene, scene.h.admin_token)
    page = c.get("/ui/records")
    resp = c.post("/ui/signout", data={"csrf": csrf_of(page.text)})
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/signin"
    assert (
        'ledger_session=""' in resp.headers["set-cookie"]
        or "Max-Age=0" in resp.headers["set-cookie"]
    )
    assert c.get("/ui/records").status_code == 303


def test_record_views_are_logged_with_the_token_name(
    scene: Scene, caplog: pytest.LogCaptureFixture
):
    secret, _ = tokenstore.create_token(scene.h.db, "officer-jane", ["records:read"])
    c = sign_in(scene, secret)
    with caplog.at_level(logging.INFO, logger="ledger.ui"):
        assert c.get(f"/ui/records/{scene.rid}").status_code == 200
    assert any(
        "officer-jane" in r.getMessage() and scene.rid in r.getMessage() for r in caplog.records
    )


def test_exports_match_the_api(scene: Scene):
    c = sign_in(scene, scene.h.admin_token)
    api = scene.h.client().get("/v1/records", params={"fields": "meta", "limit": 1000}).json()
    expected = {i["request_id"]: i for i in api["items"]}
    rows = list(csv.DictReader(io.StringIO(c.get("/ui/records.csv").text)))
    assert [r["request_id"] for r in rows] == list(expected)
    for row in rows:
        item = expected[row["request_id"]]
        assert row["log_index"] == str(item["log_index"])
        assert row["content_hash"] == item["content_hash"]
        assert row["aborted"] == str(item["aborted"]).lower()
    lines = c.get("/ui/records.ndjson").text.splitlines()
    assert [json.loads(line) for line in lines] == api["items"]
    filtered = c.get("/ui/records.csv", params={"model": "no-such-model"}).text
    assert filtered.count("\r\n") == 1  # the header only


def test_errors_are_pages_with_the_api_status(scene: Scene):
    c = sign_in(scene, scene.h.admin_token)
    bad = c.get("/ui/records", params={"tier": "9"})
    assert bad.status_code == 422 and "<html" in bad.text
    assert c.get("/ui/records/no-such-record").status_code == 404
    assert c.get("/ui/fingerprints/nope").status_code == 422
    assert c.get("/ui/nope").status_code == 404


def test_every_page_renders_and_erasing_from_the_console_is_logged(scene: Scene):
    c = sign_in(scene, scene.h.admin_token)
    for path in (
        "/ui/records",
        "/ui/records?verdict=none&held=false&content=complete",
        f"/ui/fingerprints/{scene.fp}",
        f"/ui/diff?a={scene.fp}&b={scene.fp}",
        "/ui/pools",
        "/ui/log",
    ):
        assert c.get(path).status_code == 200, path
    first = c.get("/v1/records", params={"limit": 1}).status_code  # no bearer: API refuses
    assert first == 401
    victim = scene.h.client().get("/v1/records", params={"limit": 1}).json()["items"][0]
    rid = victim["request_id"]
    page = c.get(f"/ui/records/{rid}")
    resp = c.post(f"/ui/records/{rid}/erase", data={"csrf": csrf_of(page.text), "reason": "gdpr"})
    assert resp.status_code == 303
    after = c.get(f"/ui/records/{rid}").text
    assert "content erased" in after and "gdpr" in after
    assert audit(scene.h.db, scene.h.log_key.public_key).ok


def test_the_api_docs_load_nothing_from_elsewhere(scene: Scene):
    c = browser(scene)
    for path in ("/docs", "/redoc"):
        page = c.get(path)
        assert page.status_code == 200
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert assets, path
        for asset in assets:
            assert asset.startswith("/"), (path, asset)  # served here, not by a CDN
            assert c.get(asset).status_code == 200, asset


def test_a_fingerprint_row_pointed_elsewhere_is_never_shown(tmp_path: Path):
    """A superuser points the fingerprint's index row at another leaf: the record page and the
    fingerprint page refuse (500 index_mismatch) rather than show what that leaf holds."""
    h = start_harness("sqlite", f"sqlite:///{tmp_path}/ledger.db", tmp_path)
    try:
        key, fp = h.setup_collector()
        env, disclosures = record_v2(key, fp, text_prompt=True)
        resp = h.client().post(
            "/v1/records",
            json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]},
        )
        assert resp.status_code == 201, resp.text
        rid, leaf = env.body["request_id"], resp.json()["results"][0]["log_index"]
        superuser(  # the fingerprint's row now names the record's leaf
            h,
            ("fingerprints",),
            (
                "UPDATE fingerprints SET log_index = :i WHERE fingerprint_id = :f",
                {"i": leaf, "f": fp},
            ),
        )
        c = sign_in(Scene(h, rid, fp), h.admin_token)
        for path in (f"/ui/records/{rid}", f"/ui/fingerprints/{fp}"):
            page = c.get(path)
            assert page.status_code == 500 and "index_mismatch" in page.text, path
    finally:
        h.close()


def test_non_ascii_cookies_and_form_fields_are_refused_not_a_server_error(scene: Scene):
    """A session cookie, sign-in form token or CSRF field with a non-ASCII character (chosen by
    any client, signed in or not) is refused like any other wrong value, never a 500."""
    c = browser(scene)
    page = c.get("/ui/records", headers={"cookie": "ledger_session=a.1.b.\xe9".encode("latin-1")})
    assert page.status_code == 303 and "/ui/signin" in page.headers["location"]
    assert c.get("/ui/signin").status_code == 200
    signin = c.post("/ui/signin", data={"form_token": "\xe9", "next": "/ui/records", "token": "x"})
    assert signin.status_code == 403, signin.text
    signed = sign_in(scene, scene.h.admin_token, f"/ui/records/{scene.rid}")
    form = signed.post(f"/ui/records/{scene.rid}/erase", data={"csrf": "\xe9", "reason": "r"})
    assert form.status_code == 403, form.text


def test_error_answers_of_console_downloads_and_405s_carry_the_security_headers(scene: Scene):
    c = sign_in(scene, scene.h.admin_token)
    for resp in (
        c.get(f"/ui/records/{scene.rid}/evidence.json", params={"redact": "<b>"}),
        c.get("/ui/records/no-such-record/evidence.json"),
        c.put("/ui/records"),
        # over the ledger's body limit: refused by the gate, before the console runs
        c.post(
            "/ui/signin",
            content=b"token=" + b"x" * MAX_BODY,
            headers={"content-type": "application/x-www-form-urlencoded"},
        ),
    ):
        assert resp.status_code in (404, 405, 413, 422), resp.text
        assert resp.headers["cache-control"] == "no-store", resp.headers
        assert resp.headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in resp.headers["content-security-policy"]
    api = c.get("/v1/records/no-such-record")  # the API's own answers are unchanged
    assert "content-security-policy" not in api.headers


def test_a_sign_in_cookie_with_a_non_ascii_digit_is_refused_not_a_server_error(scene: Scene):
    c = browser(scene)
    resp = c.post(
        "/ui/signin",
        data={"form_token": "x", "token": "y"},
        headers={"cookie": b"ledger_signin=\xb2.abc"},  # "\u00b2" as the server reads it
    )
    assert resp.status_code == 403 and "csrf_failed" in resp.text, resp.text


def test_a_logprob_above_zero_renders_the_record_page(scene: Scene):
    """A signer's logprob of 1000 (exp overflows) must not make its record unreadable."""
    key, fp = scene.h.setup_collector()
    env, disclosures = record_v2(key, fp, logprob=1000.0)
    resp = scene.h.client().post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert resp.status_code == 201, resp.text
    page = sign_in(scene, scene.h.admin_token).get(f"/ui/records/{env.body['request_id']}")
    assert page.status_code == 200, page.text


def test_fingerprint_fields_that_look_alike_are_shown_apart(tmp_path: Path):
    """A signer's member named "engine.batch_invariance", or ending in a zero-width space,
    is shown quoted, never as a second row of the real field."""
    h = start_harness("sqlite", f"sqlite:///{tmp_path}/l.db", tmp_path)
    try:
        key, _ = h.setup_collector()
        body = {
            "schema_version": 1,
            "model": {"name": "m", "digest": "sha256:" + "a" * 64, "digest\u200b": "x"},
            "engine": {"name": "vllm", "batch_invariance": "none", "version": '"strict\\u200b"'},
            "engine.batch_invariance": "strict\u200b",
        }
        resp = h.client().post(
            "/v1/fingerprints", json=sign_envelope(FINGERPRINT_KIND, body, key).to_dict()
        )
        assert resp.status_code in (200, 201), resp.text
        fp = resp.json()["fingerprint_id"]
        page = sign_in(Scene(h, "", fp), h.admin_token).get(f"/ui/fingerprints/{fp}").text
        found = re.findall(
            r'<th scope="row"><code>(.*?)</code></th><td><code[^>]*>(.*?)</code>', page
        )
        rows = [(html.unescape(path), html.unescape(value)) for path, value in found]
        assert ("engine.batch_invariance", "none") in rows, rows
        assert ('["engine.batch_invariance"]', '"strict\\u200b"') in rows, rows
        assert ("model.digest", "sha256:" + "a" * 64) in rows
        assert ('model["digest\\u200b"]', "x") in rows, rows
        # a value that is the JSON form of another is itself shown as JSON
        assert ("engine.version", '"\\"strict\\\\u200b\\""') in rows, rows
        paths = [path for path, _ in rows]
        assert len(paths) == len(set(paths)), rows  # no two rows look alike
    finally:
        h.close()


def test_a_held_record_offers_another_hold_not_the_same_form_again(scene: Scene):
    admin = sign_in(scene, scene.h.admin_token)
    key, fp = scene.h.setup_collector()
    env, disclosures = record_v2(key, fp, text_prompt=True, top_k=3, seed=99)
    posted = scene.h.client().post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert posted.status_code == 201, posted.text
    rid = env.body["request_id"]
    assert "Place another legal hold" not in admin.get(f"/ui/records/{rid}").text
    fresh = scene.h.client().post("/v1/holds", json={"request_id": rid, "reason": "case A"})
    assert fresh.status_code in (200, 201), fresh.text
    page = admin.get(f"/ui/records/{rid}")
    assert "Place another legal hold" in page.text and "under legal hold" in page.text
    released = scene.h.client().request(
        "DELETE", f"/v1/holds/{fresh.json()['hold_id']}", params={"reason": "case A closed"}
    )
    assert released.status_code in (200, 201), released.text
    page = admin.get(f"/ui/records/{rid}")
    assert "Place another legal hold" not in page.text and "Place legal hold" in page.text


def test_erasing_from_the_console_forgets_the_records_kept_cache_answers(scene: Scene):
    """A kept cache answer holds its record's content: the console's erasure forgets it at
    once, as the API's does (docs/CACHE.md)."""
    key, fp = scene.h.setup_collector()
    greedy = {"temperature": 0}
    env, disclosures = record_v2(key, fp, tier=1, seed=8080, text_prompt=True, request_extra=greedy)
    posted = scene.h.client().post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert posted.status_code == 201, posted.text
    rid = env.body["request_id"]
    lookup = {
        "endpoint": "/v1/completions",
        "request": record_body(fp, seed=8080, text_prompt=True, request_extra=greedy)["request"],
        "fingerprint_id": fp,
    }
    for _ in range(2):
        assert scene.h.client().post("/v1/cache/lookup", json=lookup).json()["request_id"] == rid
    hot = scene.h.server.server.config.app.state.ledger.hot_answers
    kept = {k.found.hit.request_id for k, _ in hot._items.values() if k.found.hit is not None}
    assert rid in kept
    c = sign_in(scene, scene.h.admin_token)
    page = c.get(f"/ui/records/{rid}")
    erased = c.post(f"/ui/records/{rid}/erase", data={"csrf": csrf_of(page.text), "reason": "r"})
    assert erased.status_code == 303 and "done=erased" in erased.headers["location"]
    kept = {k.found.hit.request_id for k, _ in hot._items.values() if k.found.hit is not None}
    assert rid not in kept


def test_a_console_form_is_read_only_up_to_its_small_limit(scene: Scene):
    """Forms are read before any session exists (sign-in): at most 64 KiB and 16 fields are
    read, declared or chunked, so an unauthenticated 32 MiB form (about 1 GB parsed, and the
    event loop held for seconds) is refused at once."""
    c = browser(scene)
    form = {"content-type": "application/x-www-form-urlencoded"}
    declared = c.post("/ui/signin", content=b"k=" + b"v" * 70_000, headers=form)
    assert declared.status_code == 413 and "body_too_large" in declared.text

    def chunks() -> Iterator[bytes]:
        for i in range(200):
            yield b"&k%d=%s" % (i, b"v" * 1000)

    chunked = c.post("/ui/signin", content=chunks(), headers=form)
    assert chunked.status_code == 413 and "body_too_large" in chunked.text
    many = c.post("/ui/signin", content="&".join(f"k{i}=v" for i in range(100)), headers=form)
    assert many.status_code == 422 and "form_expected" in many.text


def test_a_form_field_that_is_not_utf8_is_refused_not_replaced(scene: Scene):
    """A reason is signed into the log: bytes that are not UTF-8 were decoded with U+FFFD put
    in their place (the API answers 400 for the same bytes); now the form is refused and
    nothing is logged."""
    c = sign_in(scene, scene.h.admin_token)
    rid = scene.rid
    page = c.get(f"/ui/records/{rid}")
    form = {"content-type": "application/x-www-form-urlencoded"}
    body = f"csrf={csrf_of(page.text)}&reason=held%FF%FE"
    before = scene.h.client().get("/v1/holds").json()["holds"]
    held = c.post(f"/ui/records/{rid}/hold", content=body, headers=form)
    assert held.status_code == 422 and "form_expected" in held.text
    assert scene.h.client().get("/v1/holds").json()["holds"] == before


def test_an_export_that_meets_an_edited_row_is_never_a_complete_file(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
):
    """An erasures row inserted for a record whose content is stored: the search that reads it
    is an index mismatch. On the export's first page the answer is that error (500), never a
    200; on a later page the connection is cut before the body's end, so no client takes the
    part it got for the whole export."""
    c = sign_in(scene, scene.h.admin_token)
    with scene.h.db.read() as s:
        (index,) = s.execute(
            text("SELECT log_index FROM records WHERE request_id = :r"), {"r": scene.rid}
        ).one()
    insert = (
        "INSERT INTO erasures (request_id, log_index, reason_code, created_at) "
        "VALUES (:r, :i, 'request', '2026-01-01 00:00:00')"
    )
    superuser(scene.h, ("erasures",), (insert, {"r": scene.rid, "i": index}))
    try:
        for path in ("/ui/records.csv", "/ui/records.ndjson"):
            whole = c.get(path)
            assert whole.status_code == 500, whole.text
            assert whole.json()["error"]["code"] == "index_mismatch"
        # the edited record is the newest: pages of one, oldest first, put it on a later page
        monkeypatch.setattr("api.ui.routes.EXPORT_PAGE", 1)
        for path in ("/ui/records.csv", "/ui/records.ndjson"):
            with pytest.raises(httpx.RemoteProtocolError):
                c.get(path)
    finally:
        superuser(
            scene.h, ("erasures",), ("DELETE FROM erasures WHERE request_id = :r", {"r": scene.rid})
        )
    assert c.get("/ui/records.csv").status_code == 200
