"""Fixtures for the browser tests of ``api/ui/static``: a static server on 127.0.0.1 (for the
session) and Chromium (for a module).

WebCrypto (``crypto.subtle``) exists only in a secure context, so the page is served over
``http://127.0.0.1:<port>/`` (a secure origin), never opened from ``about:blank``. The served
folder holds a copy of ``verify.js`` and a small test page with helpers that verify many
bundles in one ``page.evaluate`` call.
"""

from __future__ import annotations

import functools
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.support.browser import chromium_path

STATIC = Path(__file__).resolve().parents[3] / "api" / "ui" / "static"

# The test page: verify.js, and helpers that keep a test to one round trip into the page.
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">
<title>verify.js tests</title><script src="verify.js"></script>
<script>
"use strict";
// Verify many bundle texts under one pinned key text (or null): {valid, failed, code, message}
// for each, in order. 16 at a time: WebCrypto's calls then overlap (verifyBundle is reentrant).
window.verifyAll = async (texts, pinnedText) => {
  const key = pinnedText ? await LedgerVerify.parsePinnedKey(pinnedText) : null;
  const out = new Array(texts.length);
  let next = 0;
  const worker = async () => {
    while (next < texts.length) {
      const i = next++;
      const r = await LedgerVerify.verifyBundle(texts[i], key);
      out[i] = {valid: r.valid, failed: r.failed, code: r.code, message: r.message};
    }
  };
  await Promise.all(Array.from({length: 16}, worker));
  return out;
};
// One full verification, its steps and summary, as the console page would show them.
window.verifyOne = async (text, pinnedText) => {
  const key = pinnedText ? await LedgerVerify.parsePinnedKey(pinnedText) : null;
  const seen = [];
  const r = await LedgerVerify.verifyBundle(text, key, (step) => seen.push(step.check));
  return {...r, seen};
};
// Median milliseconds of `runs` verifications (performance.now(), inside the page).
window.timeVerify = async (text, pinnedText, runs) => {
  const key = pinnedText ? await LedgerVerify.parsePinnedKey(pinnedText) : null;
  const times = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    const r = await LedgerVerify.verifyBundle(text, key);
    times.push(performance.now() - t0);
    if (!r.valid) throw new Error("not valid: " + r.failed);
  }
  times.sort((a, b) => a - b);
  return {median: times[Math.floor(times.length / 2)], min: times[0], max: times[times.length - 1]};
};
</script></head><body></body></html>
"""


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="session")
def verify_page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test page, served from a thread on an ephemeral port of 127.0.0.1."""
    root = tmp_path_factory.mktemp("verify-js")
    shutil.copy(STATIC / "verify.js", root / "verify.js")
    (root / "index.html").write_text(PAGE, encoding="utf-8")
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="verify-js-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/index.html"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class BrowserPage:
    """The test page, and the errors it raised (a test fails on any)."""

    page: Page
    errors: list[str] = field(default_factory=list)

    def evaluate(self, expression: str, arg: Any = None) -> Any:
        result = self.page.evaluate(expression, arg)
        assert not self.errors, self.errors
        return result


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """Debian's chromium, driven by Playwright.

    Module scope, not session: Playwright's sync API runs one driver per thread, and a driver
    left running for the session would make every later ``sync_playwright()`` of the run fail
    ("using Playwright Sync API inside the asyncio loop")."""
    executable = chromium_path()  # skipped without chromium, except in CI (a failure)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def verify_page(chromium: Browser, verify_page_url: str) -> Iterator[BrowserPage]:
    """One page with verify.js loaded, in a secure context."""
    page = chromium.new_page()
    loaded = BrowserPage(page)
    page.on("pageerror", lambda exc: loaded.errors.append(str(exc)))
    page.goto(verify_page_url)
    page.wait_for_function("() => window.LedgerVerify !== undefined && !!window.verifyAll")
    assert page.evaluate("() => window.isSecureContext && !!crypto.subtle"), "not a secure context"
    yield loaded
    page.close()
