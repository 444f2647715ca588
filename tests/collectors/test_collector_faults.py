"""Nothing is lost: the ledger going away mid-run, and the collector killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from client.ledger_client import LedgerClient
from collectors.collector import Collector, CollectorConfig
from collectors.proxy import create_proxy
from demo.server_thread import ServerThread, free_port
from ledger.signing import SigningKey, public_key_pem
from tests.support.cli import LEDGER, serve
from tests.support.engine import EngineServer
from tests.support.harness import Harness

pytestmark = pytest.mark.engine
RUN = 300
BODY = {"model": "fixture", "prompt": "Faults", "max_tokens": 2, "temperature": 0}


def ledger_ids(client: LedgerClient, pool: str) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        page = client.search_records(pool=pool, limit=500, cursor=cursor, fields="meta")
        ids += [item["request_id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return ids


def wait_drained(collector: Collector, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while collector.spool.pending() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert collector.spool.pending() == 0, "the spool did not drain"


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_ledger_outage_loses_and_duplicates_nothing(
    engines: dict[str, EngineServer], tmp_path: Path, backend: str, request
):
    env = {"LEDGER_CHECKPOINT_INTERVAL": "0"}
    if backend == "postgres":
        env["LEDGER_DATABASE_URL"] = request.getfixturevalue("postgres_databases").create()
    data = tmp_path / "ledger"
    port = free_port()
    ledger_proc, url = serve(data, env, port)
    admin = LedgerClient(url, (data / "admin.token").read_text().strip())
    key = SigningKey.generate()
    admin.register_key("outage", "collector", public_key_pem(key.public_key))
    engine = engines["strict"]
    collector = Collector(
        CollectorConfig(
            engine_url=engine.url,
            ledger_url=url,
            ledger_token=(data / "admin.token").read_text().strip(),
            key=key,
            pool="outage",
            worker_id="w-outage",
            model_dir=engine.model_dir,
            spool_path=tmp_path / "spool.sqlite",
            digest_cache=tmp_path / "digests.sqlite",
        )
    ).start()
    proxy = ServerThread(create_proxy(collector.state), "127.0.0.1", free_port()).start()
    try:
        with httpx.Client(base_url=proxy.url, timeout=60) as http:
            for i in range(RUN):
                if i == RUN // 3:
                    ledger_proc.send_signal(signal.SIGTERM)
                    ledger_proc.wait(timeout=30)
                if i == 2 * RUN // 3:
                    assert collector.spool.pending() > 0  # the outage was real
                    ledger_proc, _ = serve(data, env, port)
                response = http.post(
                    "/v1/completions", json=BODY, headers={"X-Request-ID": f"outage-{i:03d}"}
                )
                assert response.status_code == 200, response.text
        wait_drained(collector)
        ids = ledger_ids(admin, "outage")
        assert sorted(ids) == [f"outage-{i:03d}" for i in range(RUN)]  # all, each once
        assert collector.spool.dead_letters() == 0
        # What the collector's metrics say of it: every request recorded, spooled and
        # shipped once, and the outage seen as failed shipping attempts.
        sample = collector.metrics.registry.get_sample_value
        recorded = {"endpoint": "/v1/completions", "outcome": "recorded"}
        assert sample("collector_requests_total", recorded) == RUN
        assert sample("collector_records_spooled_total") == RUN
        assert (sample("collector_records_shipped_total") or 0) >= RUN  # a retried batch: again
        assert (sample("collector_ship_failures_total", {"code": "ledger_unreachable"}) or 0) > 0
        assert sample("collector_added_latency_seconds_count") == RUN
    finally:
        proxy.stop()
        collector.close()
        ledger_proc.terminate()
        ledger_proc.wait(timeout=30)


def start_collect_process(
    engine: EngineServer, api: Harness, tmp_path: Path, port: int, *extra: str
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            *LEDGER,
            "collect",
            "--engine-url",
            engine.url,
            "--listen",
            f"127.0.0.1:{port}",
            "--ledger",
            api.url,
            "--token-file",
            str(tmp_path / "token"),
            "--key",
            str(tmp_path / "collector.pem"),
            "--pool",
            "killed",
            "--model-dir",
            str(engine.model_dir),
            "--spool",
            str(tmp_path / "spool.sqlite"),
            *extra,
        ],
        env={**os.environ, "LEDGER_DIGEST_CACHE": str(tmp_path / "digests.sqlite")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"ledger collect exited: {proc.stdout.read()}")  # type: ignore[union-attr]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("ledger collect did not answer within 120 s")


def test_a_collector_killed_mid_run_loses_no_completed_request(
    engines: dict[str, EngineServer], api: Harness, tmp_path: Path
):
    key = api.collector()
    (tmp_path / "collector.pem").write_bytes(key.private_pem())
    (tmp_path / "token").write_text(api.token("records:write"))
    port = free_port()
    engine = engines["strict"]
    proc = start_collect_process(engine, api, tmp_path, port)
    completed: list[str] = []
    killed_at = None
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        for i in range(60):
            request_id = f"kill-{api.backend}-{i:02d}"
            if i == 30:
                killed_at = i
                # Kill while a request is in flight: send it, then SIGKILL at once.
                sender = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        "import httpx,sys; httpx.post(sys.argv[1], json={'model':'fixture',"
                        "'prompt':'x','max_tokens':16,'temperature':0},"
                        " headers={'X-Request-ID': sys.argv[2]}, timeout=60)",
                        f"http://127.0.0.1:{port}/v1/completions",
                        request_id,
                    ],
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(0.05)
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                sender.wait(timeout=60)
                proc = start_collect_process(engine, api, tmp_path, port)
                continue
            try:
                response = http.post(
                    "/v1/completions", json=BODY, headers={"X-Request-ID": request_id}
                )
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                completed.append(request_id)
    assert killed_at == 30 and len(completed) == 59
    try:
        client = LedgerClient(api.url, api.admin_token)
        deadline = time.monotonic() + 120
        ids: list[str] = []
        while time.monotonic() < deadline:
            ids = [i for i in ledger_ids(client, "killed") if i.startswith(f"kill-{api.backend}")]
            if set(completed) <= set(ids):
                break
            time.sleep(0.5)
        assert set(completed) <= set(ids)
        assert len(ids) == len(set(ids))  # each exactly once
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_json_log_lines_of_a_collector_name_each_request(
    engines: dict[str, EngineServer], api: Harness, tmp_path: Path
):
    key = api.collector()
    (tmp_path / "collector.pem").write_bytes(key.private_pem())
    (tmp_path / "token").write_text(api.token("records:write"))
    port = free_port()
    proc = start_collect_process(
        engines["strict"],
        api,
        tmp_path,
        port,
        "--log-format",
        "json",
        "--log-level",
        "info",
        "--no-register",
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            ok = http.post("/v1/completions", json=BODY, headers={"X-Request-ID": "log-json-1"})
            refused = http.post(
                "/v1/completions", content=b"{", headers={"X-Request-ID": "log-json-2"}
            )
        assert ok.status_code == 200 and refused.status_code == 400
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]  # all JSON
    assert lines and all(
        {"time", "level", "logger", "message", "request_id"} <= set(x) for x in lines
    ), out
    named = {x["request_id"] for x in lines}
    assert {"log-json-1", "log-json-2"} <= named, out
    assert any("fingerprint" in x["message"] for x in lines)  # the start-up line too
