"""``/metrics`` under ``ledger serve --workers 2``: one consistent view whichever process
answers a scrape (counters summed across processes, never jumping back), and the log gauges
read from the database (tree size, the latest checkpoint's signed age, live workers and their
collectors' unacknowledged records, from signed heartbeats)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from client.ledger_client import LedgerClient
from demo.server_thread import free_port
from tests.support.certification_worker import add_worker
from tests.support.served import Served, serve

_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$", re.M)


def samples(text: str, name: str) -> dict[str, float]:
    """``labels -> value`` of every sample of metric ``name`` in an exposition."""
    return {
        m["labels"] or "": float(m["value"]) for m in _SAMPLE.finditer(text) if m["name"] == name
    }


def fresh_get(url: str, path: str) -> httpx.Response:
    """One request on its own connection, so the kernel hands it to either process."""
    with httpx.Client(headers={"Connection": "close"}, timeout=30) as c:
        return c.get(url + path)


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_counts_add_up_across_processes_and_the_log_gauges_are_the_logs(
    tmp_path: Path, backend: str, request
):
    if backend == "postgres":
        db_url = request.getfixturevalue("postgres_databases").create()
    else:
        db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    served = serve(tmp_path, db_url, free_port(), 2)
    worker = None
    try:
        url = served.url
        healthz = 'method="GET",route="/healthz",status="200"'
        seen: list[float] = []
        for round_ in range(1, 6):
            for _ in range(8):
                assert fresh_get(url, "/healthz").status_code == 200
            for _ in range(3):  # whichever process answers, all 8 x round_ are counted
                text = fresh_get(url, "/metrics").text
                count = samples(text, "ledger_http_requests_total").get(healthz, 0.0)
                seen.append(count)
                assert count == 8 * round_, (round_, seen)
        assert seen == sorted(seen)

        token = (tmp_path / "admin.token").read_text().strip()
        worker = add_worker(url, token)
        text = fresh_get(url, "/metrics").text
        size = samples(text, "ledger_log_tree_size")[""]
        assert size >= 3  # the log key, the worker's key and its fingerprint
        assert samples(text, "ledger_workers_live") == {f'pool="{worker.pool}"': 1.0}
        # a heartbeat saying 7 records wait in the collector's spool: the gauge says 7
        worker.spool_pending = 7
        with LedgerClient(url, token) as api:
            worker.heartbeat(api)
            (pool,) = [p for p in api.pools() if p["pool"] == worker.pool]
            assert pool["workers"][0]["spool_pending"] == 7
        pending = samples(fresh_get(url, "/metrics").text, "ledger_collector_spool_pending")
        assert pending == {f'pool="{worker.pool}",worker_id="{worker.worker_id}"': 7.0}
        with LedgerClient(url, token) as api:
            api.sign_checkpoint()
        text = fresh_get(url, "/metrics").text
        assert samples(text, "ledger_log_checkpoint_tree_size")[""] == size
        assert 0 <= samples(text, "ledger_log_checkpoint_age_seconds")[""] < 60
        _the_cache_gauges_count_the_live_processes(served)
    finally:
        if worker is not None:
            worker.close()
        served.stop(signal.SIGTERM)


def _workers(parent: int) -> set[int]:
    """The server's worker processes (multiprocessing's spawned children of ``parent``)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat, cmdline = (entry / "stat").read_text(), (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        # stat: "pid (comm) state ppid ...": comm may hold spaces, so split after its ")"
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"spawn_main" in cmdline:
            found.add(int(entry.name))
    return found


def _the_cache_gauges_count_the_live_processes(served: Served) -> None:
    """Each process keeps its own cache answers: the gauges add up the live ones (two limits
    of 128 MiB). A worker killed and restarted by the server leaves its figures behind; they
    are dropped at the next scrape, so the sum stays that of two processes."""
    limit = 2 * 128 * 1024 * 1024

    def figures() -> tuple[float, float]:
        text = fresh_get(served.url, "/metrics").text
        return (
            samples(text, "ledger_cache_kept_bytes_limit")[""],
            samples(text, "ledger_cache_kept_bytes")[""],
        )

    assert figures() == (limit, 0.0)
    before = _workers(served.proc.pid)
    assert len(before) == 2, before
    os.kill(min(before), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        now = _workers(served.proc.pid)
        if len(now) == 2 and now != before:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    (new,) = now - before
    environ = Path(f"/proc/{new}/environ").read_bytes().split(b"\0")
    (directory,) = [
        v.split(b"=", 1)[1] for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")
    ]
    deadline = time.monotonic() + 30
    while not (Path(directory.decode()) / f"gauge_livesum_{new}.db").exists():  # set as it starts
        assert time.monotonic() < deadline
        time.sleep(0.2)
    while figures()[0] < limit:  # its file is made as its gauge is, then the limit set
        assert time.monotonic() < deadline
        time.sleep(0.2)
    for _ in range(5):
        assert figures() == (limit, 0.0)


@pytest.mark.parametrize("workers", [1, 2])
def test_json_log_lines_name_the_request(tmp_path: Path, workers: int):
    served = serve(
        tmp_path, f"sqlite:///{tmp_path / 'l.db'}", free_port(), workers, "--log-format", "json"
    )
    try:
        with httpx.Client(timeout=30) as c:
            named = c.get(served.url + "/v1/keys", headers={"X-Request-ID": "audit-42"})
            unnamed = c.get(served.url + "/healthz", headers={"X-Request-ID": "bad id/.."})
        assert named.status_code == 401 and named.headers["x-request-id"] == "audit-42"
        made = unnamed.headers["x-request-id"]
        assert made.startswith("api-") and made != "bad id/.."
    finally:
        served.stop(signal.SIGTERM)
    lines = [json.loads(line) for line in served.output().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message", "request_id"} <= set(x) for x in lines)
    access = {x["request_id"]: x for x in lines if x["logger"] == "uvicorn.access"}
    assert access["audit-42"]["path"] == "/v1/keys" and access["audit-42"]["status"] == 401
    assert access[made]["path"] == "/healthz" and access[made]["status"] == 200
    assert any("log key" in x["message"] for x in lines)
