"""Soak: mixed traffic through `ledger collect` for a long while; memory slope and lost records.

Starts, as separate processes: a vLLM CPU server on a fixture model (--model, tiny by default;
default scheduler), `ledger serve` (embedded SQLite in a scratch directory, or --db URL) and
`ledger collect` in front of the engine, shipping to that ledger under a pool named for this
run. For --minutes it sends mixed traffic through the collector from --concurrency clients:
completions and chat, streamed and not, varied max_tokens, greedy, seeded and sampled,
logprobs (with top alternatives) sometimes, n=2 when sampled, an X-Request-ID of ours on about
half, half of the greedy requests at tier 1 (cache answers), streamed clients that leave
after a few chunks (their records are marked aborted), and a few requests vLLM refuses
(max_tokens beyond the model's length: 400, no record). The same clients spend
--lookup-share of their turns (0.2 by default) asking the ledger's cache
(``POST /v1/cache/lookup``) for greedy requests of the same prompts: hits once recorded,
misses before, so the ledger's kept cache answers fill and turn over as in production. The
client keeps its own ledger: every request ID (X-Request-ID of the answer) and what it got.

Every --sample-seconds it samples the resident memory (VmRSS from /proc/PID/status, summed
over the process tree: vLLM's frontend and engine-core processes count as the engine) of the
collector, the ledger and the engine, the collector's /metrics counters (spooled, shipped,
pending, dead-lettered, unrecordable), the ledger's count of created records, and the size on
disk of the spool and of an embedded ledger's database (write-ahead logs included).

At the end it waits for the spool to drain (pending 0), lists the run's records through the
ledger's search route (pool filter, every page) and compares them with the client's ledger:

- expected: the request IDs that got a 2xx: answers read to the end, streams the client left
  (an aborted record is expected), streams cut without `[DONE]` (reported apart);
- lost: an expected ID with no record (each confirmed absent with GET /v1/records/{id});
- extra: a record whose ID did not get a 2xx (refused, unanswered, or never sent by us), plus
  every record beyond the first for one ID. So the run's record count equals expected - lost
  + extra, and equals the number of 2xx exactly when both are 0. Records whose aborted flag
  differs from what the client saw are reported, not counted (a client may leave just as the
  whole answer was recorded).

Memory slope: per process, an ordinary least-squares line of RSS (MB) against time (hours) over
the samples after --warmup-minutes, with a 95% confidence interval from Student's t with n - 2
degrees of freedom (scipy is not installed; the quantile is computed here exactly, from the
regularised incomplete beta function, by bisection). The slope counts as indistinguishable
from zero when the interval contains 0, or when |slope| x 24 h is under 1% of the process's
mean RSS. The second rule is there because samples ten seconds apart are autocorrelated, so
the OLS interval is too narrow and over a long run excludes 0 for drifts of no consequence
(allocator and cache settling); growth of under 1% a day is no leak worth a restart. A slope
outside both is reported as growing (or shrinking). The interval also says when a run was too
short to tell: a wide one contains 0 and proves nothing.

Targets: every process's slope indistinguishable from zero, 0 lost, 0 extra. The exit status is
1 when a record is lost or extra.

    .venv/bin/python bench/soak.py --minutes 30 --concurrency 8 --json soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest import machine  # noqa: E402
from bench.proxy import LEDGER, prompts, wait_http  # noqa: E402
from client.ledger_client import LedgerClient  # noqa: E402
from demo.server_thread import free_port  # noqa: E402
from fixture_model import build  # noqa: E402
from fixture_model.engine import DEFAULT_ENGINE_PYTHON, EngineServer, start_engines  # noqa: E402
from ledger.errors import NotFound  # noqa: E402
from ledger.signing import SigningKey, public_key_pem  # noqa: E402

PROCESSES = ("collector", "ledger", "engine")
COLLECTOR_METRICS = {
    "spooled": "collector_records_spooled_total",
    "shipped": "collector_records_shipped_total",
    "pending": "collector_records_pending",
    "dead_lettered": "collector_records_dead_lettered",
    "unrecordable": "collector_unrecordable_total",
    "ship_failures": "collector_ship_failures_total",
}
EXPECTED = ("completed", "disconnected", "cut")  # the client got a 2xx


# --- traffic ---------------------------------------------------------------------------------


@dataclass
class ClientLedger:
    """What the clients saw: request ID -> outcome, for every answer they got."""

    outcomes: dict[str, str] = field(default_factory=dict)  # completed, disconnected, cut, ...
    kinds: Counter[str] = field(default_factory=Counter)
    unanswered: int = 0  # transport errors before a status: no ID known unless we sent it
    id_mismatches: int = 0  # the answer's X-Request-ID was not the one we sent
    stream_error_chunks: int = 0
    errors: list[str] = field(default_factory=list)
    lookups: Counter[str] = field(default_factory=Counter)  # cache lookups: hit, miss, error


@dataclass(frozen=True)
class Planned:
    endpoint: str
    body: dict[str, Any]
    headers: dict[str, str]
    leave_after: int | None  # streamed chunks to read before leaving; None: read to the end
    kind: str


def plan_request(rng: random.Random, texts: list[str], request_id: str | None) -> Planned:
    chat = rng.random() < 0.5
    stream = rng.random() < 0.4
    leave_after = rng.randint(2, 6) if rng.random() < 0.05 else None
    refused = leave_after is None and rng.random() < 0.02
    max_tokens = rng.choice((1, 4, 8, 16, 32, 64))
    if leave_after is not None:
        # The longest prompt is 125 tokens, with the chat template 132: all fit in 256.
        stream, max_tokens = True, rng.choice((64, 96, 120))
    body: dict[str, Any] = {"model": "fixture", "max_tokens": 1000 if refused else max_tokens}
    text = rng.choice(texts)
    body.update({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text})
    roll = rng.random()
    body["temperature"] = 0 if roll < 0.5 else 0.8
    if 0.5 <= roll < 0.75:
        body["seed"] = rng.randint(0, 2**31)
    if rng.random() < 0.5 or leave_after is not None:
        body["ignore_eos"] = True
    logprobs = rng.random() < 0.3
    if logprobs and chat:
        body.update(logprobs=True, top_logprobs=rng.randint(0, 5))
    elif logprobs:
        body["logprobs"] = rng.randint(0, 5)
    if not stream and leave_after is None and body["temperature"] and rng.random() < 0.1:
        body["n"] = 2  # vLLM refuses n > 1 with greedy sampling
    if stream:
        body["stream"] = True
    kind = "/".join(
        (
            "chat" if chat else "completions",
            "stream" if stream else "whole",
            *(["logprobs"] if logprobs else []),
            *(["leaves"] if leave_after is not None else []),
            *(["refused"] if refused else []),
        )
    )
    headers = {"X-Request-ID": request_id} if request_id else {}
    if body["temperature"] == 0 and "seed" not in body and rng.random() < 0.5:
        headers["X-Reproducibility-Tier"] = "1"  # greedy, recorded at tier 1: a cache answer
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    return Planned(endpoint, body, headers, leave_after, kind)


def plan_lookup(rng: random.Random, texts: list[str], pool: str) -> dict[str, Any]:
    """A cache lookup for a request the traffic sends greedily at tier 1 (a hit once it was
    recorded and shipped; a miss before, or for a shape not sent yet)."""
    chat = rng.random() < 0.5
    text = rng.choice(texts)
    request: dict[str, Any] = {
        "max_tokens": rng.choice((1, 4, 8, 16, 32, 64)),
        "model": "fixture",
        "temperature": 0,
        **({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}),
    }
    if rng.random() < 0.5:
        request["ignore_eos"] = True
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    return {"endpoint": endpoint, "pool": pool, "request": request}


async def lookup(client: httpx.AsyncClient, payload: dict[str, Any], book: ClientLedger) -> None:
    try:
        r = await client.post("/v1/cache/lookup", json=payload)
        outcome = "error" if r.status_code != 200 else ("hit" if r.json()["hit"] else "miss")
        if r.status_code != 200 and len(book.errors) < 20:
            book.errors.append(f"cache lookup: {r.status_code}: {r.text[:300]}")
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        outcome = "error"
        if len(book.errors) < 20:
            book.errors.append(f"cache lookup: {type(exc).__name__}: {exc}")
    book.lookups[outcome] += 1


async def send(client: httpx.AsyncClient, p: Planned, book: ClientLedger) -> None:
    sent_id = p.headers.get("X-Request-ID")
    got: str | None = None
    status = 0
    try:
        async with client.stream("POST", p.endpoint, json=p.body, headers=p.headers) as r:
            status, got = r.status_code, r.headers.get("x-request-id")
            if sent_id and got != sent_id:
                book.id_mismatches += 1
            if not 200 <= status < 300:
                text = (await r.aread())[:300].decode(errors="replace")
                outcome = f"refused_{status}"
                if not p.kind.endswith("refused") and len(book.errors) < 20:
                    book.errors.append(f"{p.kind}: unplanned {status}: {text}")
            elif not p.body.get("stream"):
                data = json.loads(await r.aread())
                outcome = "completed" if data.get("choices") else "cut"
            else:
                outcome, chunks = "cut", 0
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line[6:].strip() == "[DONE]":
                        outcome = "completed"  # read on to the end: the connection is reused
                        continue
                    if '"error"' in line and '"choices"' not in line:
                        book.stream_error_chunks += 1
                    chunks += 1
                    if p.leave_after is not None and chunks >= p.leave_after:
                        outcome = "disconnected"  # leaving the block closes the connection
                        break
    except (httpx.HTTPError, ValueError) as exc:
        if status == 0:
            book.unanswered += 1
            outcome = "unanswered"
        else:
            outcome = "cut" if 200 <= status < 300 else f"refused_{status}"
        if len(book.errors) < 20:
            book.errors.append(f"{p.kind}: {type(exc).__name__}: {exc}")
    request_id = got or sent_id
    book.kinds[p.kind] += 1
    if request_id is not None:
        book.outcomes[request_id] = outcome


async def traffic(
    urls: dict[str, str], token: str, args: argparse.Namespace, run: str, pool: str
) -> ClientLedger:
    """--concurrency clients of the collector; each also asks the ledger's cache, in turn,
    --lookup-share of its turns."""
    book = ClientLedger()
    texts = prompts(500)
    deadline = time.monotonic() + 60 * args.minutes
    limits = httpx.Limits(
        max_connections=args.concurrency, max_keepalive_connections=args.concurrency
    )
    async with (
        httpx.AsyncClient(base_url=urls["collector"], timeout=300, limits=limits) as client,
        httpx.AsyncClient(
            base_url=urls["ledger"],
            timeout=300,
            # a client's turns between lookups can outlast the server's keep-alive (5 s):
            # a pooled connection reused as the server closes it fails (httpx ReadError)
            limits=httpx.Limits(
                max_connections=args.concurrency,
                max_keepalive_connections=args.concurrency,
                keepalive_expiry=2.0,
            ),
            headers={"Authorization": f"Bearer {token}"},
        ) as cache,
    ):

        async def worker(w: int) -> None:
            rng = random.Random(args.seed * 1000 + w)
            n = 0
            while time.monotonic() < deadline:
                n += 1
                if rng.random() < args.lookup_share:
                    await lookup(cache, plan_lookup(rng, texts, pool), book)
                    continue
                rid = f"soak-{run}-{w}-{n}" if rng.random() < 0.5 else None
                await send(client, plan_request(rng, texts, rid), book)

        await asyncio.gather(*(worker(w) for w in range(args.concurrency)))
    return book


# --- sampling --------------------------------------------------------------------------------


def process_children() -> dict[int, list[int]]:
    """Parent PID -> child PIDs, from /proc/*/stat (no psutil)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    return children


def tree_rss_mb(root: int, children: dict[int, list[int]]) -> tuple[float, int]:
    """VmRSS summed over ``root`` and its descendants (MB), and how many processes that is.
    Pages shared between the processes of a tree count once per process, as VmRSS does."""
    total_kb, count, todo = 0, 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
                    count += 1
    return total_kb / 1024, count


def metric_sums(text: str) -> dict[str, float]:
    """Prometheus text -> value by ``name{labels}`` as written, and by bare name summed over
    its labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
            bare = name.split("{", 1)[0]
            if bare != name:
                out[bare] = out.get(bare, 0.0) + float(value)
    return out


def outcomes(metrics: dict[str, float]) -> dict[str, float]:
    """The collector's requests by outcome (collector_requests_total), over both endpoints."""
    out: Counter[str] = Counter()
    for name, value in metrics.items():
        if name.startswith("collector_requests_total{"):
            out[name.split('outcome="', 1)[1].split('"', 1)[0]] += int(value)
    return dict(out)


def files_mb(pattern: list[Path]) -> float:
    return sum(f.stat().st_size for f in pattern if f.is_file()) / 2**20


async def sample(
    client: httpx.AsyncClient,
    pids: dict[str, int],
    urls: dict[str, str],
    files: dict[str, list[Path]],
    began: float,
) -> dict[str, Any]:
    children = process_children()
    rss = {name: tree_rss_mb(pid, children) for name, pid in pids.items()}
    out: dict[str, Any] = {
        "t_s": round(time.monotonic() - began, 3),
        "rss_mb": {name: round(mb, 2) for name, (mb, _) in rss.items()},
        "processes": {name: n for name, (_, n) in rss.items()},
        "disk_mb": {name: round(files_mb(paths), 2) for name, paths in files.items()},
    }
    try:
        c = metric_sums((await client.get(urls["collector"] + "/metrics")).text)
        out["collector"] = {k: c.get(m, 0.0) for k, m in COLLECTOR_METRICS.items()}
        led = metric_sums((await client.get(urls["ledger"] + "/metrics")).text)
        out["ledger_records_created"] = led.get(
            'ledger_records_ingested_total{status="created"}', 0.0
        )
        out["ledger_cache_kept"] = {
            "bytes": led.get("ledger_cache_kept_bytes", 0.0),
            "answers": led.get("ledger_cache_kept_answers", 0.0),
            "limit": led.get("ledger_cache_kept_bytes_limit", 0.0),
        }
    except httpx.HTTPError as exc:
        out["metrics_error"] = str(exc)
    return out


async def soak(
    args: argparse.Namespace,
    urls: dict[str, str],
    pids: dict[str, int],
    files: dict[str, list[Path]],
    run: str,
    token: str,
    pool: str,
) -> tuple[ClientLedger, list[dict[str, Any]], float]:
    """Traffic for --minutes, sampled every --sample-seconds while it runs."""
    samples: list[dict[str, Any]] = []
    began = time.monotonic()
    load = asyncio.ensure_future(traffic(urls, token, args, run, pool))
    async with httpx.AsyncClient(timeout=30) as client:
        while not load.done():
            samples.append(await sample(client, pids, urls, files, began))
            s = samples[-1]
            print(
                f"{s['t_s'] / 60:6.1f} min  "
                + "  ".join(f"{n} {s['rss_mb'][n]:.1f} MB" for n in PROCESSES)
                + f"  spooled {s.get('collector', {}).get('spooled', 0):.0f}"
                f"  pending {s.get('collector', {}).get('pending', 0):.0f}"
                f"  ledger {s.get('ledger_records_created', 0):.0f}"
                f"  kept {s.get('ledger_cache_kept', {}).get('bytes', 0) / 2**20:.1f} MB"
                f"  spool files {s['disk_mb']['spool']:.1f} MB",
                flush=True,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(load), args.sample_seconds)
    return load.result(), samples, time.monotonic() - began


# --- statistics ------------------------------------------------------------------------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for aa in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + aa * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0 or x >= 1:
        return max(0.0, min(1.0, x))
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for p in (0.5, 1), by bisection on the exact CDF."""

    def cdf(t: float) -> float:
        return 1 - 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def slope_fit(points: list[tuple[float, float]]) -> dict[str, Any]:
    """OLS of RSS (MB) on time (h): slope, its 95% CI and the verdict (module docstring)."""
    n = len(points)
    if n < 3:
        return {"samples": n, "verdict": "too few samples"}
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    resid = sum((y - my - slope * (x - mx)) ** 2 for x, y in points)
    half = t_quantile(0.975, n - 2) * math.sqrt(resid / (n - 2) / sxx)
    lo, hi = slope - half, slope + half
    day_pct = 100 * abs(slope) * 24 / my
    flat = lo <= 0 <= hi or day_pct < 1
    return {
        "samples": n,
        "mean_mb": my,
        "first_mb": points[0][1],
        "last_mb": points[-1][1],
        "slope_mb_per_h": slope,
        "ci95_mb_per_h": [lo, hi],
        "ci_contains_zero": lo <= 0 <= hi,
        "day_growth_pct_of_rss": day_pct,
        "verdict": "indistinguishable from zero"
        if flat
        else ("growing" if slope > 0 else "shrinking"),
    }


# --- the ledger's side -----------------------------------------------------------------------


def cache_full_since(samples: list[dict[str, Any]]) -> float | None:
    """When the ledger's kept cache answers first came within 10% of their limit (eviction
    under way from there on: each answer is charged a few tens of KiB), or None."""
    for s in samples:
        kept = s.get("ledger_cache_kept", {})
        if kept.get("limit") and kept["bytes"] >= 0.9 * kept["limit"]:
            return float(s["t_s"])
    return None


def wait_drained(url: str, timeout: float) -> dict[str, Any]:
    """Poll the collector until its spool holds nothing, three times in a row, a second apart
    (a client that left has its aborted record spooled by a task of its own); its counters
    then, and its requests by outcome."""
    deadline, calm = time.monotonic() + timeout, 0
    while True:
        m = metric_sums(httpx.get(url + "/metrics", timeout=30).text)
        now: dict[str, Any] = {k: m.get(v, 0.0) for k, v in COLLECTOR_METRICS.items()}
        calm = calm + 1 if now["pending"] == 0 else 0
        if calm >= 3 or time.monotonic() > deadline:
            return {**now, "requests_by_outcome": outcomes(m)}
        time.sleep(1)


def check(ledger: LedgerClient, pool: str, book: ClientLedger) -> dict[str, Any]:
    held: dict[str, list[dict[str, Any]]] = {}
    cursor: str | None = None
    while True:
        page = ledger.search_records(pool=pool, limit=1000, fields="meta", cursor=cursor)
        for item in page["items"]:
            held.setdefault(item["request_id"], []).append(item)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    expected = {rid: o for rid, o in book.outcomes.items() if o in EXPECTED}
    lost = []
    for rid in sorted(rid for rid in expected if rid not in held):
        try:  # the search missed nothing: the record is not there by ID either
            held[rid] = [ledger.get_record(rid)]
        except NotFound:
            lost.append(rid)
    extra = {
        rid: len(items) - (rid in expected)
        for rid, items in held.items()
        if len(items) - (rid in expected) > 0
    }
    flags = Counter(
        f"{o} -> {'aborted' if held[rid][0]['aborted'] else 'complete'}"
        for rid, o in expected.items()
        if rid in held
    )
    found = sorted(set(expected) - set(lost))
    spot = random.Random(0).sample(found, min(20, len(found)))
    bad_spot = [
        rid for rid in spot if ledger.get_record(rid)["envelope"]["body"].get("request_id") != rid
    ]
    return {
        "records": sum(len(v) for v in held.values()),
        "expected": len(expected),
        "lost": len(lost),
        "extra": sum(extra.values()),
        "lost_ids": lost,
        "extra_ids": {rid: book.outcomes.get(rid, "not ours") for rid in extra},
        "record_flags": dict(flags),
        "spot_checked": len(spot),
        "spot_check_failures": bad_spot,
    }


# --- running it ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--warmup-minutes", type=float, default=5)
    parser.add_argument("--sample-seconds", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--model", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--db", help="ledger database URL (default: SQLite in a scratch dir)")
    parser.add_argument(
        "--token-file", type=Path, help="admin token, for a --db bootstrapped before"
    )
    parser.add_argument("--drain-timeout", type=float, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--lookup-share",
        type=float,
        default=0.2,
        help="share of each client's turns spent on a cache lookup at the ledger (0: none)",
    )
    parser.add_argument(
        "--ledger-cache-mb",
        type=float,
        help="LEDGER_CACHE_MEMORY_BYTES for the ledger, in MiB (default: the ledger's, 128), so "
        "that its kept cache answers fill within the run and the slope once full is measured",
    )
    parser.add_argument(
        "--engine-cpus",
        default="0" if (os.cpu_count() or 1) <= 4 else "auto",
        help="VLLM_CPU_OMP_THREADS_BIND for the engine's compute threads (as bench/proxy.py)",
    )
    parser.add_argument("--json", type=Path, help="write every sample and result here")
    args = parser.parse_args()
    run = uuid.uuid4().hex[:8]
    pool = f"soak-{run}"
    work = Path(tempfile.mkdtemp(prefix="ledger-soak-"))
    model = build(work / "model", size=args.model)
    engine = EngineServer(
        model,
        (),
        work / "vllm.log",
        str(DEFAULT_ENGINE_PYTHON),
        env={"VLLM_CPU_OMP_THREADS_BIND": args.engine_cpus},
    )
    start_engines([engine])
    procs: list[subprocess.Popen[bytes]] = []
    logs = [(work / f"{name}.log").open("wb") for name in ("ledger", "collector")]
    try:
        # Not bench/ingest.py's start_server: it sends the ledger's output to /dev/null, and a
        # soak wants its warnings.
        ledger_port, collect_port = free_port(), free_port()
        env = {
            **os.environ,
            "LEDGER_DATA_DIR": str(work / "ledger"),
            "LEDGER_PORT": str(ledger_port),
        }
        if args.db:
            env["LEDGER_DATABASE_URL"] = args.db
        if args.ledger_cache_mb is not None:
            env["LEDGER_CACHE_MEMORY_BYTES"] = str(int(args.ledger_cache_mb * 2**20))
        procs.append(
            subprocess.Popen(
                [*LEDGER, "serve", "--log-level", "warning"],
                env=env,
                cwd=ROOT,
                stdout=logs[0],
                stderr=subprocess.STDOUT,
            )
        )
        ledger_url = f"http://127.0.0.1:{ledger_port}"
        wait_http(ledger_url + "/healthz", procs[-1])
        token_file = args.token_file or work / "ledger" / "admin.token"
        if not token_file.exists():
            raise SystemExit(f"{args.db} was bootstrapped before: give its admin --token-file")
        token = token_file.read_text().strip()
        key = SigningKey.generate()
        (work / "collector.pem").write_bytes(key.private_pem())
        (work / "token").write_text(token)
        ledger = LedgerClient(ledger_url, token, timeout=120)
        ledger.register_key(pool, "collector", public_key_pem(key.public_key))
        procs.append(
            subprocess.Popen(
                [
                    *LEDGER,
                    "collect",
                    *("--engine-url", engine.url, "--listen", f"127.0.0.1:{collect_port}"),
                    *("--ledger", ledger_url, "--token-file", str(work / "token")),
                    *("--key", str(work / "collector.pem"), "--pool", pool),
                    *("--model-dir", str(model), "--spool", str(work / "spool.sqlite")),
                ],
                env={**os.environ, "LEDGER_DIGEST_CACHE": str(work / "digests.sqlite")},
                cwd=ROOT,
                stdout=logs[1],
                stderr=subprocess.STDOUT,
            )
        )
        collect_url = f"http://127.0.0.1:{collect_port}"
        wait_http(collect_url + "/metrics", procs[-1])
        if args.engine_cpus != "auto":  # as bench/proxy.py: the rest share the other CPUs
            others = set(range(os.cpu_count() or 1)) - {int(c) for c in args.engine_cpus.split(",")}
            for pid in [0, *(p.pid for p in procs)]:
                os.sched_setaffinity(pid, others or {0})
        pids = {"collector": procs[1].pid, "ledger": procs[0].pid, "engine": engine.pid}
        urls = {"collector": collect_url, "ledger": ledger_url}
        print(f"{machine()}; model {args.model}; pool {pool}; logs in {work}", flush=True)
        # Disk: the spool (its write-ahead log included) and an embedded ledger's database.
        sqlite = ("", "-wal", "-shm")
        files = {
            "spool": [work / f"spool.sqlite{x}" for x in sqlite],
            "ledger_db": [] if args.db else [work / "ledger" / f"ledger.db{x}" for x in sqlite],
        }
        book, samples, elapsed = asyncio.run(soak(args, urls, pids, files, run, token, pool))
        drained = wait_drained(collect_url, args.drain_timeout)
        result = check(ledger, pool, book)
        after = [s for s in samples if s["t_s"] >= 60 * args.warmup_minutes]
        slopes = {
            name: slope_fit([(s["t_s"] / 3600, s["rss_mb"][name]) for s in after])
            for name in PROCESSES
        }
        full = cache_full_since(samples)
        if full is not None:  # the ledger once its kept answers reached their limit
            slopes["ledger (cache full)"] = slope_fit(
                [(s["t_s"] / 3600, s["rss_mb"]["ledger"]) for s in after if s["t_s"] >= full]
            )
        report(args, book, samples, slopes, drained, result, elapsed, work)
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "machine": machine(),
                        "args": {k: str(v) for k, v in vars(args).items()},
                        "pool": pool,
                        "elapsed_s": elapsed,
                        "client": {
                            "outcomes": dict(Counter(book.outcomes.values())),
                            "kinds": dict(book.kinds),
                            "unanswered": book.unanswered,
                            "id_mismatches": book.id_mismatches,
                            "stream_error_chunks": book.stream_error_chunks,
                            "cache_lookups": dict(book.lookups),
                            "errors": book.errors,
                        },
                        "collector_after_drain": drained,
                        "ledger_check": result,
                        "slopes": slopes,
                        "cache_full_since_s": full,
                        "samples": samples,
                    },
                    indent=2,
                )
            )
        if result["lost"] or result["extra"]:
            sys.exit(1)
    except BaseException:
        print(f"failed; the engine's, ledger's and collector's logs are in {work}", file=sys.stderr)
        raise
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=60)
        engine.stop()
        for log in logs:
            log.close()


def report(
    args: argparse.Namespace,
    book: ClientLedger,
    samples: list[dict[str, Any]],
    slopes: dict[str, dict[str, Any]],
    drained: dict[str, Any],
    result: dict[str, Any],
    elapsed: float,
    work: Path,
) -> None:
    outcomes = Counter(book.outcomes.values())
    total = sum(book.kinds.values())
    print(
        f"\n{total} requests in {elapsed / 60:.1f} min ({total / elapsed:.1f}/s) at concurrency "
        f"{args.concurrency}: "
        + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        + f", unanswered {book.unanswered}; answer ID mismatches {book.id_mismatches}; "
        f"error chunks {book.stream_error_chunks}"
    )
    print(
        "cache lookups at the ledger: "
        + (", ".join(f"{k} {v}" for k, v in sorted(book.lookups.items())) or "none")
    )
    for err in book.errors[:5]:
        print(f"  client error: {err}")
    print(
        "collector after drain: "
        + ", ".join(f"{k} {v:.0f}" for k, v in drained.items() if k in COLLECTOR_METRICS)
        + f"; requests by outcome {drained['requests_by_outcome']}"
    )
    print(
        f"ledger: {result['records']} records for the run; expected (2xx) {result['expected']}; "
        f"lost {result['lost']} (target 0); extra {result['extra']} (target 0); "
        f"flags {result['record_flags']}; spot-checked by ID {result['spot_checked']}, "
        f"failures {len(result['spot_check_failures'])}"
    )
    for rid in result["lost_ids"][:10]:
        print(f"  lost: {rid} ({book.outcomes[rid]})")
    for rid, why in list(result["extra_ids"].items())[:10]:
        print(f"  extra: {rid} ({why})")
    print(
        f"\nRSS slope after {args.warmup_minutes:g} min warm-up, {len(samples)} samples every "
        f"{args.sample_seconds:g} s (target: indistinguishable from zero: 95% CI holds 0, or "
        "|slope| x 24 h < 1% of RSS)"
    )
    print(
        "| process | samples | RSS first / last MB | slope MB/h | 95% CI MB/h | 24 h as % RSS "
        "| verdict |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, f in slopes.items():
        if "slope_mb_per_h" not in f:
            print(f"| {name} | {f['samples']} | | | | | {f['verdict']} |")
            continue
        lo, hi = f["ci95_mb_per_h"]
        print(
            f"| {name} | {f['samples']} | {f['first_mb']:.1f} / {f['last_mb']:.1f} | "
            f"{f['slope_mb_per_h']:+.2f} | [{lo:+.2f}, {hi:+.2f}] | "
            f"{f['day_growth_pct_of_rss']:.2f}% | {f['verdict']} |"
        )
    kept = [s["ledger_cache_kept"] for s in samples if "ledger_cache_kept" in s]
    if kept:
        full = cache_full_since(samples)
        print(
            f"ledger's kept cache answers: {kept[-1]['answers']:.0f} at the end, "
            f"{max(k['bytes'] for k in kept) / 2**20:.1f} MiB at most of "
            f"{kept[-1]['limit'] / 2**20:.1f} MiB; "
            + ("never full" if full is None else f"full from {full / 60:.1f} min")
        )
    first, last = samples[0]["disk_mb"], samples[-1]["disk_mb"]
    print(
        "disk (database, write-ahead log and its index): "
        + "; ".join(f"{n} {first[n]:.1f} -> {last[n]:.1f} MB" for n in first)
    )
    print(f"logs: {work}")


if __name__ == "__main__":
    main()
