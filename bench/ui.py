"""Console speed: search and record pages at 1M records on Postgres, and in-browser verification.

Uses (or builds) the Postgres log of ``bench/log.py`` (--leaves records of 16 prompt and 16
output tokens, schema v1, loaded with binary COPY), adds 20 schema v2 records through the
API, and starts ``ledger serve`` (one worker) on it. Then, signed in through the console's form
with an admin token, one client over keep-alive HTTP times --requests requests of each page:

- ``search``: /ui/records, newest first (the page a person opens first);
- ``search, filtered``: /ui/records with a model, tier and "not replayed" filter;
- ``search, aborted only``: no record matches; the page scans its 1,000-row budget and
  answers an empty page with a cursor (the worst case of a filter the index cannot narrow);
- ``record``: /ui/records/{id} of a random record (v1: its content is in its leaf);
- ``record, schema v2``: a random one of the v2 records (its disclosures opened);

and reports p50 and p95 per run: the server's own time (its ``Server-Timing`` header, taken
when the page's head is sent, which for these pages is after the whole body is rendered) and
the client-observed time on the loopback. Last, Debian's chromium (Playwright) opens a v1 and
a v2 record page --browser-runs times and reads the time the page's own script took to verify
the bundle with WebCrypto (``data-ms`` of the verification panel): median and p95.

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

from bench.cache import server_ms  # noqa: E402
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
    c: httpx.Client, leaves: int, v2: list[str], requests: int, rng: random.Random
) -> dict[str, tuple[float, float, float, float]]:
    """Per page: server p50 and p95 (its Server-Timing), client-observed p50 and p95."""
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
        "record, schema v2 (disclosures opened)": lambda: (f"/ui/records/{rng.choice(v2)}", None),
    }
    out = {}
    for label, make in pages.items():
        for _ in range(10):  # warm up
            path, params = make()
            c.get(path, params=params).raise_for_status()
        server, client = [], []
        for _ in range(requests):
            path, params = make()
            t = time.perf_counter()
            resp = c.get(path, params=params)
            client.append((time.perf_counter() - t) * 1000)
            resp.raise_for_status()
            server.append(server_ms(resp))
        out[label] = (
            percentile(server, 50),
            percentile(server, 95),
            percentile(client, 50),
            percentile(client, 95),
        )
    return out


def _figures(f: tuple[float, ...]) -> str:
    return (
        f"server p50 {f[0]:.2f} ms, p95 {f[1]:.2f} ms; client p50 {f[2]:.2f} ms, p95 {f[3]:.2f} ms"
    )


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
        v2 = add_v2_records(api, token, 20)
        rng = random.Random(1)
        per_run: dict[str, list[tuple[float, ...]]] = {}
        c = console_client(api, token)
        try:
            for run in range(args.runs):
                timed = time_pages(c, args.leaves, v2, args.requests, rng)
                for label, figures in timed.items():
                    per_run.setdefault(label, []).append(figures)
                    print(f"run {run + 1}: {label}: {_figures(figures)}")
        finally:
            c.close()
        for label, values in per_run.items():
            median = tuple(statistics.median(v[i] for v in values) for i in range(4))
            print(f"{label}: median of {args.runs} runs: {_figures(median)}")
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
