"""Regenerate the console's screenshots in docs/ui/ (PNG), from a throwaway SQLite ledger
filled by tests/support/console_scene.py, in Debian's chromium driven by Playwright.

    .venv/bin/python docs/ui/screenshots.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from ledger.signing import public_key_pem  # noqa: E402
from tests.support.browser import chromium, sign_in  # noqa: E402
from tests.support.console_scene import build_scene  # noqa: E402
from tests.support.harness import start_harness  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        h = start_harness("sqlite", f"sqlite:///{d}/ledger.db", d)
        try:
            scene = build_scene(h)
            pages = {
                "records": "/ui/records",
                "record": f"/ui/records/{scene.ids['diverged']}",
                "fingerprint": f"/ui/fingerprints/{scene.fingerprint_id}",
                "diff": f"/ui/diff?a={scene.fingerprint_id}&b={scene.other_fingerprint_id}",
                "pools": "/ui/pools",
                "log": "/ui/log",
            }
            with chromium() as browser:
                for width, suffix in ((1280, ""), (390, "-phone")):
                    page = browser.new_page(viewport={"width": width, "height": 900})
                    page.goto(f"{h.url}/ui/signin")
                    if not suffix:
                        page.screenshot(path=HERE / "signin.png")
                    sign_in(page, h.url, h.admin_token)
                    page.goto(h.url + pages["record"])
                    page.locator("details.pin summary").click()
                    page.get_by_label("Log public key").fill(public_key_pem(h.log_key.public_key))
                    page.get_by_role("button", name="Pin and verify again").click()
                    for name, path in pages.items():
                        if suffix and name != "record":
                            continue
                        page.goto(h.url + path)
                        if name == "record":
                            page.locator("#verify[data-state]").wait_for()
                        out = HERE / f"{name}{suffix}.png"
                        page.screenshot(path=out, full_page=True)
                        print(f"wrote {out.relative_to(ROOT)}")
                    page.close()
        finally:
            h.close()


if __name__ == "__main__":
    main()
