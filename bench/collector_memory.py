"""Collector memory by kind of traffic: which requests leave memory behind?

The collector (``ledger collect``, durable spool) runs in front of the instant engine of
``bench/collector_speed.py`` and ships to ``ledger serve``, each its own process. After a
warm-up of every kind, each round sends --requests requests of each kind in turn (concurrency
--concurrency) and reads the collector's resident memory before and after, once its spool
has taken every record (and the ledger's, which ingests them); per kind, the growth over all
rounds. Kinds:

- ``whole``: a 16-token completion, not streamed;
- ``stream``: a 256-token chat answer streamed to its end;
- ``leave``: the same stream, the client leaving after two events (its record is marked
  aborted when the collector had not sent the whole answer yet);
- ``refused``: a request the engine answers with an error (no record).

Also reported per phase: the records the spool still had to take when the last client had
its answer (a backlog holds whole answers in memory), and how long draining it took.

    .venv/bin/python bench/collector_memory.py --requests 3000 --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.collector_speed import CAPTURE, Stack, request_body  # noqa: E402
from bench.ingest import machine  # noqa: E402
from bench.proxy import wait_http  # noqa: E402
from demo.server_thread import free_port  # noqa: E402
from fixture_model import build  # noqa: E402

# kind: endpoint, streamed, output tokens (17: a shape the engine has no answer for), leave
# after this many events (None: read to the end)
KINDS: dict[str, tuple[str, bool, int, int | None]] = {
    "whole": ("/v1/completions", False, 16, None),
    "stream": ("/v1/chat/completions", True, 256, None),
    "leave": ("/v1/chat/completions", True, 256, 2),
    "refused": ("/v1/completions", False, 17, None),
}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmRSS for process {pid}")


def spooled(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("collector_records_spooled_total "):
            return float(line.split()[1])
    raise SystemExit("the collector has no collector_records_spooled_total")


async def send(url: str, kind: str, count: int, concurrency: int) -> dict[int, int]:
    endpoint, stream, tokens, leave = KINDS[kind]
    body = request_body(endpoint, stream, tokens)
    statuses: dict[int, int] = {}
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one() -> None:
            async with gate, client.stream("POST", endpoint, json=body) as answer:
                statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
                if leave is None:
                    await answer.aread()
                    return
                seen = 0
                async for line in answer.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen >= leave:
                        return  # leaving the block closes the connection

        await asyncio.gather(*(one() for _ in range(count)))
    return statuses


def settle(url: str, timeout: float = 120) -> tuple[float, float]:
    """Wait until the spooled count stops moving (a second apart); the records it rose by and
    the seconds it took."""
    began, first = time.monotonic(), spooled(url)
    last = first
    while time.monotonic() - began < timeout:
        time.sleep(1.0)
        now = spooled(url)
        if now == last:
            return now - first, (time.monotonic() - began - 1.0) if now > first else 0.0
        last = now
    raise SystemExit(f"the spool still took records after {timeout:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=3000, help="per kind and round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--kinds", default=",".join(KINDS), help="of: " + ", ".join(KINDS))
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        ap.error(f"unknown kinds {unknown}; choose from {list(KINDS)}")
    work = Path(tempfile.mkdtemp(prefix="ledger-collector-memory-"))
    engine = None
    stack = None
    try:
        model = build(work / "model", size="small")
        port = free_port()
        engine = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "instant_engine.py"), str(CAPTURE), str(port)]
        )
        wait_http(f"http://127.0.0.1:{port}/v1/models", engine)
        stack = Stack(work, f"http://127.0.0.1:{port}", model)
        pid, ledger = stack.collector.pid, stack.ledger.pid
        print(f"machine: {machine()}")
        for kind in kinds:
            asyncio.run(send(stack.url, kind, 500, args.concurrency))
        settle(stack.url)
        start, ledger_start = rss_mb(pid), rss_mb(ledger)
        growth = dict.fromkeys(kinds, 0.0)
        ledger_growth = dict.fromkeys(kinds, 0.0)
        for round_ in range(args.rounds):
            for kind in kinds:
                before, ledger_before = rss_mb(pid), rss_mb(ledger)
                began = time.monotonic()
                statuses = asyncio.run(send(stack.url, kind, args.requests, args.concurrency))
                took = time.monotonic() - began
                at_end = rss_mb(pid)
                backlog, drained = settle(stack.url)
                after = rss_mb(pid)
                growth[kind] += after - before
                ledger_growth[kind] += rss_mb(ledger) - ledger_before
                print(
                    f"round {round_ + 1} {kind:8s} {statuses} in {took:.1f} s: RSS {before:.1f}"
                    f" -> {at_end:.1f} at the last answer -> {after:.1f} MB; spool backlog "
                    f"{backlog:.0f} records, drained in {drained:.1f} s; ledger RSS "
                    f"{ledger_before:.1f} -> {rss_mb(ledger):.1f} MB",
                    flush=True,
                )
        print(
            f"over {args.rounds} rounds: collector RSS {start:.1f} -> {rss_mb(pid):.1f} MB, "
            f"ledger {ledger_start:.1f} -> {rss_mb(ledger):.1f} MB"
        )
        for kind, mb in growth.items():
            print(
                f"  {kind:8s} collector {mb:+.1f} MB ({mb / args.rounds:+.2f} a round), "
                f"ledger {ledger_growth[kind]:+.1f} MB"
            )
    finally:
        if stack is not None:
            stack.close()
        if engine is not None:
            engine.terminate()
            engine.wait(timeout=20)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
