"""The console in a real browser (Debian's chromium, driven by Playwright): sign in, search,
open a record and watch it verify in the page; a tampered bundle fails at the named step; no
pinned key says so; a redacted download verifies with `ledger verify`; the CSV export is the
API's; a reader sees no action; nothing is fetched from anywhere but the ledger; every page
passes axe-core and reads on a phone."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Route, expect
from typer.testing import CliRunner

from cli.main import app as cli
from ledger import disclosures
from ledger.packing import unpack_int32
from ledger.signing import public_key_pem
from tests.support.browser import axe_violations, chromium, requests_of, sign_in
from tests.support.console_scene import ConsoleScene, build_scene
from tests.support.harness import start_harness

VERIFY_TIMEOUT = 15_000  # ms


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleScene]:
    d = tmp_path_factory.mktemp("console-browser")
    h = start_harness("sqlite", f"sqlite:///{d}/ledger.db", d)
    yield build_scene(h)
    h.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    p = context.new_page()
    yield p
    context.close()


def _pem(scene: ConsoleScene) -> str:
    return public_key_pem(scene.h.log_key.public_key)


def _wait_verified(page: Page) -> str:
    panel = page.locator("#verify[data-state]")
    panel.wait_for(timeout=VERIFY_TIMEOUT)
    return str(panel.get_attribute("data-state"))


def _pin(page: Page, scene: ConsoleScene) -> None:
    page.locator("details.pin summary").click()
    page.get_by_label("Log public key").fill(_pem(scene))
    page.get_by_role("button", name="Pin and verify again").click()


def test_sign_in_search_open_and_verify_in_the_browser(page: Page, scene: ConsoleScene):
    seen = requests_of(page)
    sign_in(page, scene.h.url, scene.h.admin_token)
    expect(page.get_by_role("heading", name="Records")).to_be_visible()
    page.get_by_label("Replay verdict").select_option("diverged")
    page.get_by_role("button", name="Search").click()
    rows = page.locator("table.results tbody tr")
    expect(rows).to_have_count(1)
    page.get_by_role("link", name=scene.ids["diverged"]).click()
    expect(page.get_by_role("heading", name=f"Record {scene.ids['diverged']}")).to_be_visible()
    assert _wait_verified(page) == "valid"
    expect(page.locator("#pin-state")).to_contain_text("No log key is pinned")
    steps = page.locator("#steps li")
    states = steps.evaluate_all("els => els.map(e => [e.dataset.check, e.dataset.state])")
    assert [s for _, s in states if s != "pass"] == [], states
    for check in ("jcs", "collector_signature", "inclusion_proof", "checkpoint_signature"):
        assert [check, "pass"] in states
    _pin(page, scene)
    expect(page.locator("#pin-state")).to_contain_text("Pinned log key")
    assert _wait_verified(page) == "valid"
    expect(page.locator("#verify-result")).to_contain_text("VALID")
    # the first divergence of the diverged replay is marked in the token view
    diverging = page.locator(".tokens .tok.diverges").first
    expect(diverging).to_be_visible()
    diverging.focus()
    expect(diverging.locator(".tip")).to_be_visible()  # top-k on keyboard focus
    expect(page.get_by_text("first diverged at token 11")).to_be_visible()
    for url in seen:
        assert url.startswith(scene.h.url + "/") or url.startswith("data:"), url


def _flip_a_logprob_bit(bundle: dict[str, Any]) -> dict[str, Any]:
    """The bundle with one bit of one output logprob flipped inside its disclosure."""
    for i, encoded in enumerate(bundle["disclosures"]):
        salt, member, value = json.loads(
            base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        )
        if member.endswith(".logprobs"):
            raw = bytearray(base64.b64decode(value))
            raw[0] ^= 0x01
            text = json.dumps(
                [salt, member, base64.b64encode(bytes(raw)).decode()],
                separators=(",", ":"),
                ensure_ascii=False,
            )
            bundle["disclosures"][i] = base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")
            return bundle
    raise AssertionError("no logprobs disclosure in the bundle")


@pytest.mark.parametrize(
    ("tamper", "failed"),
    [
        (_flip_a_logprob_bit, "disclosures"),
        (lambda b: {**b, "leaf_index": b["leaf_index"] + 1}, "inclusion_proof"),
        (
            lambda b: {
                **b,
                "keys": {**b["keys"], "collector": {**b["keys"]["collector"], "role": "log"}},
            },
            "collector_key",
        ),
    ],
)
def test_a_bundle_tampered_in_transit_fails_at_the_named_step(
    page: Page, scene: ConsoleScene, tamper: Any, failed: str
):
    sign_in(page, scene.h.url, scene.h.admin_token)

    def edit(route: Route) -> None:
        response = route.fetch()
        route.fulfill(response=response, body=json.dumps(tamper(response.json())))

    page.route("**/evidence.json", edit)
    page.goto(f"{scene.h.url}/ui/records/{scene.ids['bitwise']}")
    assert _wait_verified(page) == "invalid"
    assert page.locator("#verify").get_attribute("data-failed") == failed
    expect(page.locator(f'#steps li[data-check="{failed}"]')).to_have_attribute(
        "data-state", "fail"
    )
    expect(page.locator("#verify-result")).to_contain_text("INVALID")


@pytest.mark.parametrize(
    "respell",
    [
        lambda raw: raw.replace(b'"exported_at": "', b'"exported_at": "\xff', 1),
        lambda raw: b"\xef\xbb\xbf\xef\xbb\xbf" + raw,  # two BOMs: `ledger verify` skips one
    ],
    ids=["invalid utf-8 in a member nothing signs", "two byte order marks"],
)
def test_the_console_reads_the_bundles_bytes_as_ledger_verify_reads_a_file(
    page: Page, scene: ConsoleScene, respell: Any
):
    """The page hands verify.js the bytes it fetched, not text the browser decoded (which
    mends invalid UTF-8 and drops a BOM): bytes `ledger verify` refuses are refused here."""
    sign_in(page, scene.h.url, scene.h.admin_token)

    def edit(route: Route) -> None:
        response = route.fetch()
        raw = json.dumps(response.json()).encode()
        route.fulfill(response=response, body=respell(raw))

    page.route("**/evidence.json", edit)
    page.goto(f"{scene.h.url}/ui/records/{scene.ids['bitwise']}")
    assert _wait_verified(page) == "invalid"
    assert page.locator("#verify").get_attribute("data-failed") == "format"


def test_a_redacted_download_verifies_with_ledger_verify(
    page: Page, scene: ConsoleScene, tmp_path: Path
):
    sign_in(page, scene.h.url, scene.h.admin_token)
    page.goto(f"{scene.h.url}/ui/records/{scene.ids['plain']}")
    page.get_by_role("checkbox", name="prompt").check()
    with page.expect_download() as info:
        page.get_by_role("button", name="Download redacted bundle").click()
    path = tmp_path / "bundle.json"
    info.value.save_as(path)
    key = tmp_path / "log.pem"
    key.write_text(_pem(scene))
    out = CliRunner().invoke(cli, ["verify", str(path), "--log-key", str(key), "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    statuses = json.dumps(report)
    assert "redacted" in statuses and "disclosed" in statuses


def test_the_csv_export_is_the_api_search(page: Page, scene: ConsoleScene, tmp_path: Path):
    sign_in(page, scene.h.url, scene.h.admin_token)
    with page.expect_download() as info:
        page.get_by_role("link", name="Export CSV").click()
    path = tmp_path / "records.csv"
    info.value.save_as(path)
    lines = path.read_text().splitlines()
    api = scene.h.client().get("/v1/records", params={"fields": "meta", "limit": 1000}).json()
    assert [line.split(",")[0] for line in lines[1:]] == [i["request_id"] for i in api["items"]]


def test_a_reader_sees_no_admin_action(page: Page, scene: ConsoleScene):
    sign_in(page, scene.h.url, scene.h.token("records:read"))
    page.goto(f"{scene.h.url}/ui/records/{scene.ids['plain']}")
    expect(page.get_by_role("heading", name="Prompt")).to_be_visible()
    assert page.get_by_role("button", name="Place legal hold").count() == 0
    assert page.get_by_role("button", name="Erase content (logged, irreversible)").count() == 0


def test_a_form_posted_without_its_csrf_token_is_refused(page: Page, scene: ConsoleScene):
    sign_in(page, scene.h.url, scene.h.admin_token)
    rid = scene.ids["plain"]
    page.goto(f"{scene.h.url}/ui/records/{rid}")
    form = page.locator("form.action", has=page.get_by_role("button", name="Place legal hold"))
    form.locator('input[name="csrf"]').evaluate("e => { e.value = ''; }")
    page.get_by_label("Reason for a legal hold").fill("forged by another page")
    with page.expect_response(f"**/ui/records/{rid}/hold") as info:
        page.get_by_role("button", name="Place legal hold").click()
    assert info.value.status == 403
    expect(page.get_by_text("CSRF token is missing or wrong")).to_be_visible()
    held = scene.h.client().get("/v1/records", params={"held": "true", "limit": 1000}).json()
    assert rid not in [i["request_id"] for i in held["items"]]


def test_search_with_several_filters_and_the_record_in_tokens(page: Page, scene: ConsoleScene):
    sign_in(page, scene.h.url, scene.h.admin_token)
    page.get_by_label("Pool").fill("strict")
    page.get_by_label("Tier").select_option("2")
    page.get_by_label("Legal hold").select_option("true")
    page.get_by_role("button", name="Search").click()
    rows = page.locator("table.results tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(scene.ids["held"])
    page.get_by_label("Pool").fill("no-such-pool")
    page.get_by_role("button", name="Search").click()
    expect(rows).to_have_count(0)
    page.goto(f"{scene.h.url}/ui/records/{scene.ids['held']}")
    record = scene.h.client().get(f"/v1/records/{scene.ids['held']}").json()
    opened = {d.member: d.value for d in map(disclosures.parse, record["disclosures"])}
    ids = unpack_int32(opened["prompt_token_ids"], "prompt_token_ids")
    assert ids
    shown = page.locator("#prompt-tokens .tok").all_inner_texts()
    assert [int(t) for t in shown] == ids
    members = page.locator("table", has=page.locator("caption", has_text="Committed members"))
    states = members.locator("tbody tr").evaluate_all(
        "rows => rows.map(r => [r.cells[1].innerText, r.cells[2].innerText])"
    )
    assert states and all(hold == "held" for _, hold in states), states


PAYLOAD = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def test_recorded_content_is_shown_as_text_never_run(page: Page, scene: ConsoleScene):
    """A prompt, an output and a model name written to attack the officer's browser."""
    from ledger.record_v2 import commit_record
    from ledger.records import RECORD_KIND, Choice, build_record_body
    from ledger.signing import sign_envelope

    key, fp = scene.h.setup_collector()
    model = 'm"><svg onload="window.__pwned=3">'
    body = build_record_body(
        request_id="req-xss-1",
        fingerprint_id=fp,
        worker_id="w1",
        pool="p1",
        tier=1,
        endpoint="/v1/completions",
        model=model,
        request={"model": model, "prompt": PAYLOAD, "max_tokens": 2},
        prompt_token_ids=[1, 2],
        choices=[Choice([3, 4], [-0.1, -0.2], text=PAYLOAD)],
        started_at="2026-12-01T09:00:00.000000Z",
        ttft_ns=1,
        total_ns=2,
        system_fingerprint=None,
    )
    committed, disclosures = commit_record(body)
    env = sign_envelope(RECORD_KIND, committed, key)
    resp = scene.h.client().post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert resp.status_code == 201, resp.text
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    seen = requests_of(page)
    sign_in(page, scene.h.url, scene.h.admin_token)
    for path in ("/ui/records", "/ui/records/req-xss-1"):
        page.goto(scene.h.url + path)
        page.wait_for_load_state("networkidle")
        assert page.evaluate("window.__pwned") is None, path
        expect(page.get_by_text(model).first).to_be_visible()
    expect(page.locator("pre.text").first).to_have_text(PAYLOAD)
    assert dialogs == []
    assert not [u for u in seen if u.endswith("/x")]  # the <img src=x> never loaded


def _pages(scene: ConsoleScene) -> list[str]:
    return [
        "/ui/records",
        f"/ui/records/{scene.ids['diverged']}",
        f"/ui/records/{scene.ids['erased']}",
        f"/ui/fingerprints/{scene.fingerprint_id}",
        f"/ui/diff?a={scene.fingerprint_id}&b={scene.other_fingerprint_id}",
        "/ui/pools",
        "/ui/log",
    ]


def test_every_page_passes_axe_and_fits_a_phone(browser: Browser, scene: ConsoleScene):
    for width in (1280, 390):
        context = browser.new_context(viewport={"width": width, "height": 844})
        page = context.new_page()
        seen = requests_of(page)
        page.goto(f"{scene.h.url}/ui/signin")
        assert axe_violations(page) == []
        sign_in(page, scene.h.url, scene.h.admin_token)
        for path in _pages(scene):
            page.goto(scene.h.url + path)
            if "/ui/records/" in path:
                _wait_verified(page)
            violations = axe_violations(page)
            assert violations == [], (path, width, [(v["id"], v["help"]) for v in violations])
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 0, (path, width, overflow)
        for url in seen:
            assert url.startswith(scene.h.url + "/") or url.startswith("data:"), url
        context.close()
