"""Collector speed at GPU rates, on CPU: the collector in front of an instant engine.

The engine (``bench/instant_engine.py``) answers every request at once with the bytes real
vLLM 0.32 sent for a request of that shape (captured from the fixture model: completions and
chat, streamed or not, 16 and 256 output tokens, top-5 logprobs), so the collector's own cost
is what is measured. ``ledger collect`` (durable spool, ``synchronous=FULL``) runs in front of
it, shipping to ``ledger serve`` (SQLite), each its own process. For each shape and each
concurrency (default 1, 16, 64, 256), connections send the shape's request back to back for
--seconds, through the collector and, at concurrency 1, straight to the engine; reported:

- sustained recorded requests/s (every answered request is a spooled record: checked at the
  end against the collector's ``collector_records_total``);
- p50 and p99 latency, and at concurrency 1 the added p50 and p99 (through minus straight);
- the collector process's CPU per request (user + system, from /proc), and the ledger's.

With --soak MINUTES it instead sends the shapes in turn (10 s each, concurrency 16) for that
long, sampling every 10 s the resident memory of the collector and of the ledger and the size
of the spool's and of the ledger database's write-ahead logs, and reports each process's
memory slope after a minute's warm-up (as bench/soak.py decides it, per hour and per million
requests), the largest logs, and answered against recorded: a soak at GPU rates, where
growth per request shows within minutes. --ledger-prefix runs ``ledger serve`` under a tool
(``--ledger-prefix 'heaptrack -o DIR/ledger'``: what the ledger's live heap is, against its
RSS); memory and CPU are still the ledger process's own.

Medians of --runs runs. Targets (issue: keep up with a GPU): 16-token completions with top-5
>= 1,500 requests/s at concurrency 64, collector CPU <= 1.0 ms per request, added p50 <= 1 ms
at concurrency 1; 256-token streamed chat >= 500 requests/s.

    .venv/bin/python bench/collector_speed.py --runs 3
    .venv/bin/python bench/collector_speed.py --soak 10
    .venv/bin/python bench/collector_speed.py --soak 9 --ledger-prefix 'heaptrack -o /tmp/ht/ledger'
    .venv/bin/python bench/collector_speed.py --capture   # refresh the capture (needs vLLM)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest import machine  # noqa: E402
from bench.proxy import cpu_seconds, wait_http  # noqa: E402
from client.ledger_client import LedgerClient  # noqa: E402
from demo.server_thread import free_port  # noqa: E402
from fixture_model import build  # noqa: E402
from ledger.signing import SigningKey, public_key_pem  # noqa: E402

CAPTURE = ROOT / "bench" / "data" / "vllm-responses.json"
LEDGER = [sys.executable, "-m", "cli"]
PROMPT = "the ledger records every answer a model gives and proves it later"
SHAPES = {
    "completions, 16 tokens, top-5": ("/v1/completions", False, 16),
    "completions, 16 tokens, top-5, streamed": ("/v1/completions", True, 16),
    "completions, 256 tokens, top-5": ("/v1/completions", False, 256),
    "chat, 16 tokens, top-5": ("/v1/chat/completions", False, 16),
    "chat, 256 tokens, top-5, streamed": ("/v1/chat/completions", True, 256),
}


def request_body(endpoint: str, stream: bool, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "fixture",
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 7,
        "ignore_eos": True,
        "stream": stream,
    }
    if endpoint == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": PROMPT}]
        body["logprobs"] = True
        body["top_logprobs"] = 5
    else:
        body["prompt"] = PROMPT
        body["logprobs"] = 5
    return body


def raw_request(endpoint: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {endpoint} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n\r\n"
    ).encode() + data


async def _read_answer(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    found = re.search(rb"(?i)content-length:\s*([0-9]+)", head)
    if found:
        await reader.readexactly(int(found[1]))
        return status
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return status


async def _load(
    port: int, request: bytes, concurrency: int, seconds: float
) -> tuple[int, list[float]]:
    latencies: list[float] = []
    done = 0
    deadline = time.perf_counter() + seconds

    async def connection() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                writer.write(request)
                status = await _read_answer(reader)
                if status != 200:
                    raise SystemExit(f"answer {status}")
                latencies.append(time.perf_counter() - start)
                done += 1
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(concurrency)))
    return done, latencies


def load(port: int, request: bytes, concurrency: int, seconds: float) -> tuple[float, list[float]]:
    began = time.perf_counter()
    done, latencies = asyncio.run(_load(port, request, concurrency, seconds))
    return done / (time.perf_counter() - began), latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def records_total(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("collector_records_spooled_total")
    )


class Stack:
    """ledger serve, the engine (instant, or a capture proxy) and ledger collect."""

    def __init__(
        self, work: Path, engine_url: str, model: Path, ledger_prefix: list[str] | None = None
    ) -> None:
        self.work = work
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = [(work / f"{n}.log").open("wb") for n in ("ledger", "collector")]
        ledger_port = free_port()
        env = {
            **os.environ,
            "LEDGER_DATA_DIR": str(work / "ledger"),
            "LEDGER_PORT": str(ledger_port),
        }
        self.ledger = subprocess.Popen(
            [*(ledger_prefix or []), *LEDGER, "serve", "--log-level", "warning"],
            env=env,
            stdout=self.logs[0],
            stderr=subprocess.STDOUT,
        )
        self.procs.append(self.ledger)
        ledger_url = f"http://127.0.0.1:{ledger_port}"
        wait_http(ledger_url + "/healthz", self.ledger)
        # under a prefix, the ledger is a descendant of the process started
        self.ledger_pid = serving_pid(self.ledger.pid) if ledger_prefix else self.ledger.pid
        token = (work / "ledger" / "admin.token").read_text().strip()
        key = SigningKey.generate()
        (work / "collector.pem").write_bytes(key.private_pem())
        (work / "token").write_text(token)
        LedgerClient(ledger_url, token).register_key(
            "bench", "collector", public_key_pem(key.public_key)
        )
        self.port = free_port()
        self.collector = subprocess.Popen(
            [
                *LEDGER,
                "collect",
                "--engine-url",
                engine_url,
                "--listen",
                f"127.0.0.1:{self.port}",
                "--ledger",
                ledger_url,
                "--token-file",
                str(work / "token"),
                "--key",
                str(work / "collector.pem"),
                "--pool",
                "bench",
                "--model-dir",
                str(model),
                "--spool",
                str(work / "spool.sqlite"),
                "--log-level",
                "warning",
            ],
            env={**os.environ, "LEDGER_DIGEST_CACHE": str(work / "digests.sqlite")},
            stdout=self.logs[1],
            stderr=subprocess.STDOUT,
        )
        self.procs.append(self.collector)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_http(self.url + "/metrics", self.collector)

    def close(self) -> None:
        if self.ledger_pid != self.ledger.pid:  # a prefix (heaptrack) may not pass SIGTERM on
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.ledger_pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.ledger.wait(timeout=120)  # heaptrack writes its file out
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in self.logs:
            log.close()


def serving_pid(root: int) -> int:
    """The ``python -m cli serve`` process at or under ``root``."""
    from bench.soak import process_children

    children, todo = process_children(), [root]
    while todo:
        pid = todo.pop(0)
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[1:4] == [b"-m", b"cli", b"serve"]:
                return pid
        todo += children.get(pid, [])
    raise RuntimeError(f"no ledger process under {root}")


def _wal_bytes(*paths: Path) -> int:
    return sum(p.stat().st_size for p in paths if p.exists())


def soak(stack: Stack, minutes: float) -> None:
    """Every shape in turn for ``minutes``: the collector's and the ledger's memory, the
    spool's write-ahead log and the ledger database's."""
    from bench.soak import slope_fit, tree_rss_mb

    requests = [raw_request(e, request_body(e, s, t)) for e, s, t in SHAPES.values()]
    wal = stack.work / "spool.sqlite-wal"
    began = time.monotonic()
    first = records_total(stack.url)
    # seconds, answered so far, collector RSS MB, ledger RSS MB
    samples: list[tuple[float, int, float, float]] = []
    answered = largest = ledger_largest = 0
    while time.monotonic() - began < minutes * 60:
        _, latencies = load(stack.port, requests[len(samples) % len(requests)], 16, 10.0)
        answered += len(latencies)
        largest = max(largest, _wal_bytes(wal))
        ledger_largest = max(ledger_largest, _wal_bytes(*(stack.work / "ledger").glob("*-wal")))
        rss, _ = tree_rss_mb(stack.collector.pid, {})
        ledger_rss, _ = tree_rss_mb(stack.ledger_pid, {})
        samples.append((time.monotonic() - began, answered, rss, ledger_rss))
        print(
            f"  {samples[-1][0]:6.0f} s: {answered:,} requests, collector {rss:.1f} MB, ledger "
            f"{ledger_rss:.1f} MB; write-ahead logs at most: spool {largest / 1e6:.1f} MB, "
            f"ledger {ledger_largest / 1e6:.1f} MB",
            flush=True,
        )
    after = [s for s in samples if s[0] >= 60] or samples
    recorded = records_total(stack.url) - first
    print(f"soak, {minutes:g} min: {answered:,} answered, {recorded:,.0f} recorded")
    for name, k in (("collector", 2), ("ledger", 3)):
        per_hour = slope_fit([(s[0] / 3600, s[k]) for s in after])
        per_million = slope_fit([(s[1] / 1e6, s[k]) for s in after])
        print(
            f"  {name} RSS {after[0][k]:.1f} -> {after[-1][k]:.1f} MB, slope "
            f"{per_hour.get('slope_mb_per_h', float('nan')):+.1f} MB/h "
            f"({per_million.get('slope_mb_per_h', float('nan')):+.1f} MB per million "
            f"requests): {per_hour['verdict']}"
        )
    print(
        f"  write-ahead logs at most: spool {largest / 1e6:.1f} MB, ledger "
        f"{ledger_largest / 1e6:.1f} MB"
    )


def capture(work: Path, model: Path) -> None:
    """Send every shape through a collector in front of a capture proxy in front of vLLM."""
    from aiohttp import web

    from bench.instant_engine import Capture
    from fixture_model.engine import DEFAULT_ENGINE_PYTHON, EngineServer, start_engines

    engine = EngineServer(model, (), work / "vllm.log", str(DEFAULT_ENGINE_PYTHON))
    start_engines([engine])
    cap = Capture(engine.url)
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(cap.app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    threading.Thread(target=loop.run_forever, daemon=True).start()
    stack = Stack(work, f"http://127.0.0.1:{port}", model)
    try:
        version = httpx.get(engine.url + "/version").json().get("version")
        for name, (endpoint, stream, tokens) in SHAPES.items():
            resp = httpx.post(
                stack.url + endpoint, json=request_body(endpoint, stream, tokens), timeout=120
            )
            resp.raise_for_status()
            print(f"captured: {name}")
        cap.save(CAPTURE, {"vllm_version": version, "model": "fixture (small)"})
        print(f"wrote {CAPTURE.relative_to(ROOT)}")
    finally:
        stack.close()
        engine.stop()


def shape_indexes(text: str) -> list[int]:
    """--shapes: numbers into SHAPES (argparse reports a bad one)."""
    try:
        indexes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of shape numbers: {text!r}") from None
    bad = [i for i in indexes if not 0 <= i < len(SHAPES)]
    if bad:
        raise argparse.ArgumentTypeError(f"no shape {bad[0]}: there are 0 to {len(SHAPES) - 1}")
    return indexes


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", default="1,16,64,256")
    ap.add_argument(
        "--shapes",
        type=shape_indexes,
        default=list(range(len(SHAPES))),
        help="comma-separated shape numbers: "
        + "; ".join(f"{i} {name}" for i, name in enumerate(SHAPES)),
    )
    ap.add_argument("--capture", action="store_true", help="capture vLLM's answers anew")
    ap.add_argument("--soak", type=float, metavar="MINUTES", help="memory and spool over time")
    ap.add_argument(
        "--ledger-prefix",
        type=shlex.split,
        metavar="COMMAND",
        help="run `ledger serve` under this command (e.g. 'heaptrack -o DIR/ledger')",
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ledger-collector-speed-"))
    try:
        model = build(work / "model", size="small")
        if args.capture:
            capture(work, model)
        else:
            measure(args, work, model)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the spool and ledger: hundreds of MB


def measure(args: argparse.Namespace, work: Path, model: Path) -> None:
    engine_port = free_port()
    engine = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "instant_engine.py"), str(CAPTURE), str(engine_port)]
    )
    engine_url = f"http://127.0.0.1:{engine_port}"
    wait_http(engine_url + "/v1/models", engine)
    stack = Stack(work, engine_url, model, args.ledger_prefix)
    print(f"machine: {machine()}; capture: {json.loads(CAPTURE.read_text())['vllm_version']}")
    try:
        if args.soak:
            soak(stack, args.soak)
            return
        names = list(SHAPES)
        for i in args.shapes:
            name = names[i]
            endpoint, stream, tokens = SHAPES[name]
            request = raw_request(endpoint, request_body(endpoint, stream, tokens))
            load(stack.port, request, 4, 1.0)  # warm-up
            for conc in (int(c) for c in args.concurrency.split(",")):
                rows = []
                for _ in range(args.runs):
                    before = (
                        cpu_seconds(stack.collector.pid),
                        cpu_seconds(stack.ledger_pid),
                        records_total(stack.url),
                    )
                    rps, lat = load(stack.port, request, conc, args.seconds)
                    recorded = records_total(stack.url) - before[2]
                    n = len(lat)
                    collector_cpu = (cpu_seconds(stack.collector.pid) - before[0]) / n * 1000
                    ledger_cpu = (cpu_seconds(stack.ledger_pid) - before[1]) / n * 1000
                    added = added_p99 = None
                    if conc == 1:
                        _, direct = load(engine_port, request, 1, args.seconds / 2)
                        added = pct(lat, 0.5) - pct(direct, 0.5)
                        added_p99 = pct(lat, 0.99) - pct(direct, 0.99)
                    rows.append(
                        (
                            rps,
                            pct(lat, 0.5),
                            pct(lat, 0.99),
                            collector_cpu,
                            ledger_cpu,
                            added,
                            added_p99,
                        )
                    )
                    if recorded != n:
                        print(f"  warning: {n} answered, {recorded:.0f} recorded")
                med = [
                    statistics.median(r[k] for r in rows if r[k] is not None)
                    if any(r[k] is not None for r in rows)
                    else None
                    for k in range(7)
                ]
                extra = (
                    f", added p50 {med[5]:.2f} ms, added p99 {med[6]:.2f} ms"
                    if med[5] is not None
                    else ""
                )
                print(
                    f"{name}, concurrency {conc}: {med[0]:,.0f} req/s, p50 {med[1]:.2f} ms, "
                    f"p99 {med[2]:.2f} ms, collector CPU {med[3]:.2f} ms/req, ledger CPU "
                    f"{med[4]:.2f} ms/req{extra} (median of {args.runs})",
                    flush=True,
                )
    finally:
        stack.close()
        engine.terminate()


if __name__ == "__main__":
    main()
