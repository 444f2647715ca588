"""Certification jobs across processes: ``ledger serve --workers 2`` as a real subprocess, on
SQLite and Postgres, certifying a pool whose worker is a real HTTP server answering signed
replay orders with signed outputs (``tests/support/certification_worker.py``: no engine).

A job started through one process is polled through both (every poll 200, progress never
going back); a job whose process is killed ends ``failed`` with ``interrupted`` (through the
surviving process, after a restart, and at start-up); a process that is stopped fails its
jobs at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from demo.server_thread import free_port
from ledger.signing import Envelope, load_public_key, verify_envelope
from ledger.storage.database import Database
from tests.conftest import fresh_url
from tests.support.certification_worker import Worker, add_worker
from tests.support.cli import LEDGER
from tests.support.served import Served, serve

pytestmark = pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
LEASE_S = 15  # api.certifier.LEASE
JOB_ROUTE = "/v1/certifications/{certification_id}"


@dataclass
class Ledger:
    data_dir: Path
    db_url: str
    port: int
    served: Served | None = None
    worker: Worker | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, workers: int) -> Served:
        self.served = serve(self.data_dir, self.db_url, self.port, workers, "--log-format", "json")
        return self.served

    def client(self) -> httpx.Client:
        """A new connection per request, so the kernel hands each to either process."""
        token = (self.data_dir / "admin.token").read_text().strip()
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "Connection": "close"},
            limits=httpx.Limits(max_keepalive_connections=0),
            timeout=30,
        )

    def add_worker(self, **kw: Any) -> Worker:
        token = (self.data_dir / "admin.token").read_text().strip()
        self.worker = add_worker(self.url, token, **kw)
        return self.worker

    def certify(self, **params: Any) -> dict[str, Any]:
        assert self.worker is not None
        with self.client() as c:
            started = c.post("/v1/certifications", json={"pool": self.worker.pool, **params})
        assert started.status_code == 202, started.text
        job: dict[str, Any] = started.json()
        assert job["status"] == "running" and job["done"] == 0
        return job

    def row(self, job_id: str) -> dict[str, Any]:
        """The job's row as stored (read directly, so nothing is expired by reading it)."""
        db = Database(self.db_url)
        try:
            with db.read() as s:
                found = s.execute(
                    text("SELECT * FROM certification_jobs WHERE certification_id = :i"),
                    {"i": job_id},
                ).one()
            return dict(found._mapping)
        finally:
            db.dispose()


@pytest.fixture
def ledger(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    setup = Ledger(tmp_path, fresh_url(request, backend), free_port())
    yield setup
    if setup.served is not None:
        setup.served.stop()
    if setup.worker is not None:
        setup.worker.close()


def poll(ledger: Ledger, job_id: str, until: set[str], timeout: float) -> list[dict[str, Any]]:
    """Poll through new connections until the job's status is in ``until``; every answer
    must be 200 and consistent with the one before."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    with ledger.client() as c:
        while not seen or seen[-1]["status"] not in until:
            assert time.monotonic() < deadline, f"still {seen[-1]} after {timeout} s"
            response = c.get(f"/v1/certifications/{job_id}")
            assert response.status_code == 200, (len(seen), response.text)
            job = response.json()
            if seen:
                before = seen[-1]
                assert job["done"] >= before["done"], (before, job)
                assert job["updated_at"] >= before["updated_at"]
                assert before["status"] == "running", (before, job)  # done/failed are final
                for name in ("certification_id", "total", "parameters", "created_at"):
                    assert job[name] == before[name]
            seen.append(job)
            time.sleep(0.05)
    return seen


def _served_counts(ledger: Ledger) -> dict[int, tuple[int, int]]:
    """Per process: (POSTs that started a job, polls answered), from the JSON access lines
    (each names the process that wrote it; the metrics are one view of all processes)."""
    assert ledger.served is not None
    counts: dict[int, tuple[int, int]] = {}
    for line in ledger.served.output().splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry["logger"] != "uvicorn.access":
            continue
        started, polled = counts.get(entry["pid"], (0, 0))
        if (entry["method"], entry["path"], entry["status"]) == ("POST", "/v1/certifications", 202):
            started += 1
        elif entry["method"] == "GET" and entry["path"].startswith("/v1/certifications/"):
            polled += entry["status"] == 200
        counts[entry["pid"]] = (started, polled)
    return counts


# ---- the tests ----------------------------------------------------------------------------


def test_a_certification_started_on_one_process_is_polled_through_the_other(
    ledger: Ledger,
) -> None:
    ledger.start(workers=2)
    worker = ledger.add_worker(delay=0.15)
    job = ledger.certify(prompts=8, concurrency=[1, 3], max_tokens=[4])
    assert job["total"] == 2 * 8 + 9
    seen = poll(ledger, job["certification_id"], {"done", "failed"}, timeout=120)
    final = seen[-1]
    assert final["status"] == "done", final
    assert final["done"] == final["total"] == worker.answered and final["error"] is None
    assert len({j["done"] for j in seen}) >= 4, "progress was not reported while it ran"
    # the certificate: a log leaf signed by the ledger, the same through the certificates route
    with ledger.client() as c:
        pem = c.get("/v1/log/key").json()["pem"]
        stored = c.get(f"/v1/certificates/{job['certification_id']}").json()
    verify_envelope(Envelope.from_dict(final["envelope"]), load_public_key(pem))
    body = final["envelope"]["body"]
    assert body["certificate_id"] == job["certification_id"] and body["pool"] == worker.pool
    assert body["worker_id"] == worker.worker_id and body["invariant_observed"] is True
    assert stored["envelope"] == final["envelope"] and stored["log_index"] == final["log_index"]
    # both processes answered polls (before jobs were stored, the other one answered 404)
    counts = _served_counts(ledger)
    assert sorted(started for started, _ in counts.values()) == [0, 1], counts
    assert sum(polled for _, polled in counts.values()) == len(seen), (counts, len(seen))
    assert all(polled > 0 for _, polled in counts.values()), counts


def test_a_job_whose_process_is_killed_fails_visibly_through_the_other(ledger: Ledger) -> None:
    """One of two processes dies (SIGKILL) mid-job; the other answers every poll and fails the
    job as interrupted once its lease runs out, and the supervisor's replacement process
    does not revive it."""
    ledger.start(workers=2)
    ledger.add_worker(delay=0.05, hold_after=3)
    job = ledger.certify(prompts=4, concurrency=[1], max_tokens=[4])
    job_id = job["certification_id"]
    deadline = time.monotonic() + 30
    while ledger.row(job_id)["done"] < 3:
        assert time.monotonic() < deadline, ledger.row(job_id)
        time.sleep(0.2)
    runner = ledger.row(job_id)["runner"]
    pid = int(runner.split(":")[-2])
    os.kill(pid, signal.SIGKILL)
    seen = poll(ledger, job_id, {"done", "failed"}, timeout=LEASE_S + 30)
    final = seen[-1]
    assert final["status"] == "failed" and final["done"] == 3, final
    assert final["error"]["code"] == "interrupted", final
    assert "process running it stopped" in final["error"]["message"]
    assert final["error"]["details"]["runner"] == runner
    assert "envelope" not in final
    time.sleep(1)
    with ledger.client() as c:
        again = c.get(f"/v1/certifications/{job_id}").json()
    assert again["status"] == "failed" and again["updated_at"] == final["updated_at"]


def test_a_killed_ledger_restarted_fails_the_job_at_start_up(ledger: Ledger) -> None:
    """The whole ``ledger serve`` is killed mid-job; started again after the lease ran out,
    it fails the job as it starts, before anyone asks."""
    ledger.start(workers=1)
    ledger.add_worker(delay=0.05, hold_after=2)
    job_id = ledger.certify(prompts=3, concurrency=[1], max_tokens=[4])["certification_id"]
    deadline = time.monotonic() + 30
    while ledger.row(job_id)["done"] < 2:
        assert time.monotonic() < deadline, ledger.row(job_id)
        time.sleep(0.2)
    assert ledger.served is not None
    ledger.served.stop(signal.SIGKILL)
    row = ledger.row(job_id)
    assert row["state"] == "running"  # nobody could say otherwise yet
    lease_until = row["lease_until"]
    time.sleep(LEASE_S + 1)
    ledger.start(workers=1)
    row = ledger.row(job_id)
    assert row["state"] == "failed" and json.loads(row["error"])["code"] == "interrupted"
    assert row["lease_until"] == lease_until  # failed by the sweep, never renewed
    (final,) = poll(ledger, job_id, {"failed"}, timeout=10)
    assert final["done"] == 2 and final["error"]["code"] == "interrupted"


def test_a_stopped_ledger_fails_its_jobs_at_once(ledger: Ledger) -> None:
    """SIGTERM (a deploy, a restart): the process fails its running job as it shuts down,
    without waiting for the lease, and the next ledger reports it."""
    ledger.start(workers=2)
    ledger.add_worker(delay=0.05, hold_after=2)
    job_id = ledger.certify(prompts=3, concurrency=[1], max_tokens=[4])["certification_id"]
    deadline = time.monotonic() + 30
    while ledger.row(job_id)["done"] < 2:
        assert time.monotonic() < deadline, ledger.row(job_id)
        time.sleep(0.2)
    assert ledger.served is not None
    ledger.served.stop(signal.SIGTERM)
    row = ledger.row(job_id)
    assert row["state"] == "failed", ledger.served.output()
    error = json.loads(row["error"])
    assert error["code"] == "interrupted" and "shut down" in error["message"]
    ledger.start(workers=1)
    (final,) = poll(ledger, job_id, {"failed"}, timeout=10)
    assert final["error"] == error and final["done"] == 2


def test_ledger_certify_outlives_a_restart_and_reports_the_interruption(ledger: Ledger) -> None:
    """``ledger certify`` keeps polling while the ledger is down and restarted, then reports
    the job its stopped process left: interrupted, exit 2."""
    ledger.start(workers=1)
    worker = ledger.add_worker(delay=0.05, hold_after=2)
    token = ledger.data_dir / "admin.token"
    args = ["--pool", worker.pool, "--prompts", "3", "--concurrency", "1", "--max-tokens", "4"]
    cli = subprocess.Popen(
        [*LEDGER, "certify", *args, "--api", ledger.url, "--token-file", str(token), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        db = Database(ledger.db_url)
        try:
            deadline = time.monotonic() + 60
            while True:
                with db.read() as s:
                    done = s.execute(text("SELECT max(done) FROM certification_jobs")).scalar()
                if done == 2:
                    break
                assert time.monotonic() < deadline and cli.poll() is None, cli.communicate()
                time.sleep(0.2)
        finally:
            db.dispose()
        assert ledger.served is not None
        ledger.served.stop(signal.SIGKILL)
        time.sleep(2)  # the CLI meets a ledger that does not answer
        ledger.start(workers=1)
        out, err = cli.communicate(timeout=LEASE_S + 60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 2, out + err
    assert "certification failed" in err and "[interrupted]" in err, err
    assert "process running it stopped" in err
