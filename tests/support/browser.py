"""Chromium for the console's browser tests: Debian's package driven by Playwright (PyPI).

Playwright's own browser download is not used (nor reachable here): ``executable_path``
points at the system's ``chromium``, which ``make tools`` installs. Without it the browser
tests are skipped, except in CI where that is a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (make test installs Debian's package)")
        pytest.skip("chromium is not installed (make tools installs Debian's package)")
    return path


@contextmanager
def chromium() -> Iterator[Browser]:
    path = chromium_path()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def sign_in(page: Page, base_url: str, token: str, next_path: str = "/ui/records") -> None:
    """Sign in through the form, as a person would."""
    page.goto(f"{base_url}/ui/signin?next={next_path}")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: url.startswith(base_url) and "/ui/signin" not in url)


def requests_of(page: Page) -> list[str]:
    """Every URL the page requests from now on (the list grows as it goes)."""
    seen: list[str] = []
    page.on("request", lambda request: seen.append(request.url))
    return seen


def axe_violations(page: Page, impacts: tuple[str, ...] = ("serious", "critical")) -> list[Any]:
    """axe-core's violations of those impacts on the current page (axe-core ships in the
    axe-playwright-python wheel; nothing is fetched)."""
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    return [v for v in results.response["violations"] if v.get("impact") in impacts]
