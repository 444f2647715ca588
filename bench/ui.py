"""Console speed: search and record pages at 1M records on Postgres, and in-browser verification.

Uses (or builds) the Postgres log of ``bench/log.py`` (--leaves records of 16 prompt and 16
output tokens, schema v1, loaded with binary COPY), adds a few schema v2 records through the
API, and starts ``ledger serve`` (one worker) on it. Then, signed in through the console's form
with an admin token, one client over keep-alive HTTP times --requests requests of each page:

- ``search``: /ui/records, newest first (the page a person opens first);
- ``search, filtered``: /ui/records with a model, tier and "not replayed" filter;
- ``search, aborted only``: no record matches; the page scans its 1,000-row budget and
  answers an empty page with a cursor (the worst case of a filter the index cannot narrow);
- ``record``: /ui/records/{id} of a random record (v1: its content is in its leaf);

and reports p50 and p95 per run, client-observed on the loopback (an upper bound of the
server's own time). Last, Debian's chromium (Playwright) opens a v1 and a v2 record page
--browser-runs times and reads the time the page's own script took to verify the bundle with
WebCrypto (``data-ms`` of the verification panel): median and p95.

    .venv/bin/python bench/ui.py --leaves 1000000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest import machine, start_server  # noqa: E402
from bench.log import ensure_log, percentile  # noqa: E402
from ledger.signing import SigningKey, public_key_pem  # noqa: E402
from ledger.storage import tokenstore  # noqa: E402
from ledger.storage.database import Database  # noqa: E402
from tests.support.browser import chromium, sign_in  # noqa: E402
from tests.support.documents import fingerprint_envelope, record_v2  # noqa: E402


def console_client(api: str, token: str) -> httpx.Client:
    c = httpx.Client(base_url=api, timeout=60)
    form = c.get("/ui/signin")
    found = re.search(r'name="form_token" value="([^"]+)"', form.text)
    assert found is not None
    resp = c.post("/ui/signin", data={"form_token": found[1], "token": token, "next": ""})
    assert resp.status_code in (200, 303), resp.text
    return c


def add_v2_records(api: str, token: str, n: int) -> list[str]:
    """A collector key, a fingerprint and ``n`` v2 records, through the API."""
    key = SigningKey.generate()
    with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {token}"}) as c:
        c.post(
            "/v1/keys",
            json={
                "name": "bench-ui",
                "role": "collector",
                "public_key": public_key_pem(key.public_key),
            },
        ).raise_for_status()
        fp = c.post("/v1/fingerprints", content=fingerprint_envelope(key).canonical)
        fp.raise_for_status()
        ids = []
        for i in range(n):
            env, disclosures = record_v2(
                key, fp.json()["fingerprint_id"], text_prompt=True, top_k=5, seed=i
            )
            c.post(
                "/v1/records",
                json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]},
            ).raise_for_status()
            ids.append(env.body["request_id"])
        c.post("/v1/log/checkpoint").raise_for_status()
    return ids


def time_pages(
    c: httpx.Client, leaves: int, requests: int, rng: random.Random
) -> dict[str, tuple[float, float]]:
    pages = {
        "search": lambda: ("/ui/records", None),
        "search, filtered": lambda: (
            "/ui/records",
            {"model": "test-model", "tier": "1", "verdict": "none"},
        ),
        "search, aborted only (none match: scans past 1,000 rows)": lambda: (
            "/ui/records",
            {"aborted": "true"},
        ),
        "record": lambda: (f"/ui/records/bench-{rng.randrange(leaves - 3):08d}", None),
    }
    out = {}
    for label, make in pages.items():
        for _ in range(10):  # warm up
            path, params = make()
            c.get(path, params=params).raise_for_status()
        times = []
        for _ in range(requests):
            path, params = make()
            t = time.perf_counter()
            c.get(path, params=params).raise_for_status()
            times.append((time.perf_counter() - t) * 1000)
        out[label] = (percentile(times, 50), percentile(times, 95))
    return out


def browser_verification(
    api: str, token: str, pages: dict[str, str], runs: int
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    with chromium() as browser:
        page = browser.new_page()
        sign_in(page, api, token)
        for label, rid in pages.items():
            times = []
            for _ in range(runs):
                page.goto(f"{api}/ui/records/{rid}")
                panel = page.locator("#verify[data-state]")
                panel.wait_for(timeout=30_000)
                assert panel.get_attribute("data-state") == "valid", label
                times.append(float(panel.get_attribute("data-ms") or "nan"))
            out[label] = times
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--leaves", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--browser-runs", type=int, default=20)
    ap.add_argument(
        "--pg",
        default=os.environ.get(
            "LEDGER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = ap.parse_args()
    url, data_dir, pg_version = ensure_log(args.pg, args.leaves)
    print(f"machine: {machine()}; PostgreSQL {pg_version}; log of {args.leaves:,} leaves")
    db = Database(url)
    token, _ = tokenstore.create_token(db, "bench-ui", ["admin"])
    db.dispose()
    proc, api, _ = start_server(url, data_dir, 1)
    try:
        v2 = add_v2_records(api, token, 3)
        rng = random.Random(1)
        per_run: dict[str, list[tuple[float, float]]] = {}
        c = console_client(api, token)
        try:
            for run in range(args.runs):
                for label, (p50, p95) in time_pages(c, args.leaves, args.requests, rng).items():
                    per_run.setdefault(label, []).append((p50, p95))
                    print(f"run {run + 1}: {label}: p50 {p50:.2f} ms, p95 {p95:.2f} ms")
        finally:
            c.close()
        for label, values in per_run.items():
            p50 = statistics.median(v[0] for v in values)
            p95 = statistics.median(v[1] for v in values)
            print(f"{label}: median of {args.runs} runs: p50 {p50:.2f} ms, p95 {p95:.2f} ms")
        pages = {"v1 record": f"bench-{args.leaves // 2:08d}", "v2 record": v2[0]}
        for label, times in browser_verification(api, token, pages, args.browser_runs).items():
            print(
                f"in-browser verification, {label}: median {statistics.median(times):.1f} ms, "
                f"p95 {percentile(times, 95):.1f} ms ({len(times)} page loads)"
            )
    finally:
        proc.terminate()
        proc.wait(timeout=20)


if __name__ == "__main__":
    main()
