"""Certification jobs in the database, on SQLite and Postgres: created running under a lease,
progress renewed by their runner only, failed as ``interrupted`` once the lease runs out, done
only with a logged certificate; and a running API process that loses a job's lease stops it.
(Across ``ledger serve`` processes: test_certification_serve.py.)"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ledger.clock import parse_rfc3339
from ledger.errors import Conflict, IndexMismatch, NotFound, PermissionDenied
from ledger.signing import SigningKey
from ledger.storage import certification_jobs as jobs
from ledger.storage import log, verdicts
from ledger.storage.database import Database, utcnow
from ledger.tokens import Principal
from tests.support.certification_worker import add_worker
from tests.support.cli import ledger
from tests.support.harness import Harness
from tests.support.seed import seed_ledger

LEASE = timedelta(seconds=15)
PARAMS = {"prompts": 3, "concurrency": [1, 4], "max_tokens": [8], "seed": 0, "model": None}
ISSUED_AT = "2026-12-07T08:00:00.000000Z"
STARTER = Principal("tok-starter", "starter", ("replay",))
ADMIN = Principal("tok-admin", "admin", ("admin",))


def _create(db: Database, runner: str = "host:1:a", **kw: object) -> jobs.Job:
    values: dict[str, object] = {
        "certification_id": f"cert-{uuid.uuid4().hex}",
        "pool": f"p-{uuid.uuid4().hex[:8]}",
        "worker_id": "w1",
        "fingerprint_id": "sha256:" + "ab" * 32,
        "parameters": PARAMS,
        "total": 10,
        "runner": runner,
        "lease": LEASE,
        "started_by": STARTER.token_id,
        **kw,
    }
    return jobs.create(db, **values)  # type: ignore[arg-type]


def _certificate(job: jobs.Job, invariant: bool = True) -> dict[str, Any]:
    """The certificate body a runner logs for ``job`` (its own pool, worker, fingerprint and
    parameters)."""
    return {
        "certificate_id": job.certification_id,
        "pool": job.pool,
        "worker_id": job.worker_id,
        "fingerprint_id": job.fingerprint_id,
        "parameters": job.parameters,
        "invariant_observed": invariant,
        "started_at": "2026-12-07T07:59:00.000000Z",
        "issued_at": ISSUED_AT,
    }


def _conclude(
    db: Database, log_key: SigningKey, job: jobs.Job, invariant: bool = True
) -> verdicts.Stored:
    """``job``'s runner logs its certificate (all 10 probes done)."""
    return jobs.conclude(
        db, log_key, job.certification_id, "host:1:a", done=10,
        certificate=_certificate(job, invariant),
    )  # fmt: skip


def test_a_job_is_created_running_and_read_back_as_written(db: Database) -> None:
    job = _create(db)
    assert job.state == "running" and job.done == 0 and job.total == 10
    assert job.error is None and job.certificate is None and job.log_index is None
    assert job.lease_until - job.created_at == LEASE
    again = jobs.get(db, job.certification_id)
    assert again == job
    assert again.parameters == PARAMS and again.created_at.tzinfo is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        again.state = "done"  # type: ignore[misc]
    with pytest.raises(NotFound) as missing:
        jobs.get(db, "cert-" + "0" * 32)
    assert missing.value.code == "job_not_found"


def test_only_the_runner_renews_and_reports_progress(db: Database) -> None:
    job = _create(db)
    later = job.created_at + timedelta(seconds=5)
    assert jobs.renew(db, job.certification_id, "host:1:a", done=4, lease=LEASE, now=later)
    renewed = jobs.get(db, job.certification_id, now=later)
    assert renewed.done == 4 and renewed.lease_until == later + LEASE
    assert renewed.updated_at == later
    assert not jobs.renew(db, job.certification_id, "host:2:b", done=9, lease=LEASE, now=later)
    assert not jobs.finish(db, job.certification_id, "host:2:b", done=9, error={"code": "x"})
    assert jobs.get(db, job.certification_id, now=later) == renewed


def test_an_expired_lease_fails_the_job_as_interrupted_when_it_is_read(db: Database) -> None:
    job = _create(db)
    before = job.lease_until - timedelta(seconds=1)
    assert jobs.get(db, job.certification_id, now=before).state == "running"
    after = job.lease_until + timedelta(seconds=1)
    failed = jobs.get(db, job.certification_id, now=after)
    assert failed.state == "failed" and failed.updated_at == after
    assert failed.error is not None and failed.error["code"] == "interrupted"
    assert "process running it stopped" in failed.error["message"]
    assert failed.error["details"] == {"runner": "host:1:a", "done": 0, "total": 10}
    # the runner, should it come back, holds nothing any more
    assert not jobs.renew(db, job.certification_id, "host:1:a", done=3, lease=LEASE, now=after)
    assert not jobs.finish(db, job.certification_id, "host:1:a", done=3, error={"code": "x"})
    assert jobs.get(db, job.certification_id).state == "failed"


def test_a_runner_cannot_renew_a_lease_that_already_ran_out(db: Database) -> None:
    """Even before anyone looked: a lapsed lease is lost, never silently extended."""
    job = _create(db)
    late = job.lease_until + timedelta(milliseconds=1)
    assert not jobs.renew(db, job.certification_id, "host:1:a", done=1, lease=LEASE, now=late)


def test_the_start_up_sweep_fails_only_expired_jobs(db: Database) -> None:
    now = utcnow()
    old = _create(db, now=now - timedelta(minutes=5))
    fresh = _create(db, now=now - timedelta(minutes=5), lease=timedelta(minutes=10))
    finished = _create(db, now=now - timedelta(minutes=5))
    assert jobs.finish(db, finished.certification_id, "host:1:a", done=2, error={"code": "e"})
    assert jobs.expire(db, now) == [old.certification_id]
    assert jobs.get(db, old.certification_id, now=now).error["code"] == "interrupted"  # type: ignore[index]
    assert jobs.get(db, fresh.certification_id, now=now).state == "running"
    assert jobs.get(db, finished.certification_id, now=now).error == {"code": "e"}
    assert jobs.expire(db, now) == []


def test_done_carries_the_logged_certificate(db: Database) -> None:
    seeded = seed_ledger(db)
    job = _create(db)
    body = _certificate(job)
    stored = jobs.conclude(
        db, seeded.log_key, job.certification_id, "host:1:a", done=10, certificate=body
    )
    done = jobs.get(db, job.certification_id)
    assert done.state == "done" and done.done == 10 and done.error is None
    assert done.log_index == stored.log_index and done.certificate == stored.envelope
    assert json.loads(done.certificate)["body"] == body
    # final: a late failure report from the runner changes nothing
    assert not jobs.finish(db, job.certification_id, "host:1:a", done=1, error={"code": "x"})
    assert jobs.get(db, job.certification_id) == done


def test_a_certificate_is_logged_only_with_its_job_marked_done(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One transaction: when marking the job done fails, the certificate is not logged either
    (no leaf, no index row), and the job is left for its lease to fail."""
    seeded = seed_ledger(db)
    job = _create(db)
    with db.read() as s:
        before = log.log_size(s)

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(jobs, "update", broken)
    with pytest.raises(RuntimeError):
        _conclude(db, seeded.log_key, job)
    monkeypatch.undo()
    with db.read() as s:
        assert log.log_size(s) == before
    running = jobs.get(db, job.certification_id)
    assert running.state == "running" and running.certificate is None


def test_a_done_job_pointed_at_another_leaf_is_never_answered(db: Database) -> None:
    """A superuser repoints a done job at another leaf (another job's certificate, the log
    key's registration) or drops the pointer: reading it is an index mismatch, not an answer."""
    seeded = seed_ledger(db)
    done: list[tuple[jobs.Job, int]] = []
    for _ in range(2):
        job = _create(db)
        stored = _conclude(db, seeded.log_key, job)
        done.append((job, stored.log_index))
    (first, _), (second, second_leaf) = done
    edits = [
        (f"log_index = {second_leaf}", first),
        ("log_index = 0", first),
        ("log_index = NULL", second),
    ]
    with db.engine.begin() as conn:  # the superuser also drops the CHECKs that stand in the way
        if db.is_postgres:
            conn.execute(
                text("ALTER TABLE certification_jobs DROP CONSTRAINT ck_certification_jobs_done")
            )
    for change, job in edits:
        if "NULL" in change and not db.is_postgres:
            continue  # SQLite cannot drop a CHECK; the CHECK refuses this edit there
        with db.engine.begin() as conn:
            conn.execute(
                text(f"UPDATE certification_jobs SET {change} WHERE certification_id = :i"),
                {"i": job.certification_id},
            )
        with pytest.raises(IndexMismatch) as found:
            jobs.get(db, job.certification_id)
        assert found.value.details["certification_id"] == job.certification_id


def test_a_done_jobs_facts_are_its_certificates_and_a_logged_certificate_is_never_hidden(
    db: Database,
) -> None:
    """A superuser restates a done job's pool, worker, fingerprint or parameters next to its
    real certificate: an index mismatch. Or makes it a failure with no certificate: the
    certificate is in the log, so the job is answered done with it."""
    seeded = seed_ledger(db)
    job = _create(db)
    stored = _conclude(db, seeded.log_key, job)
    honest = jobs.get(db, job.certification_id)

    def edit(**values: object) -> None:
        sets = ", ".join(f"{k} = :{k}" for k in values)
        with db.engine.begin() as conn:
            conn.execute(
                text(f"UPDATE certification_jobs SET {sets} WHERE certification_id = :i"),
                {**values, "i": job.certification_id},
            )

    for column, value in (
        ("pool", "p9"),
        ("worker_id", "w9"),
        ("fingerprint_id", "sha256:" + "cd" * 32),
        ("parameters", json.dumps({**PARAMS, "prompts": 99}, sort_keys=True)),
        # equal to the signed ones as Python values, not as JSON: True == 1, 3.0 == 3
        ("parameters", json.dumps({**PARAMS, "seed": False}, sort_keys=True)),
        ("parameters", json.dumps({**PARAMS, "concurrency": [True, 4]}, sort_keys=True)),
        ("parameters", json.dumps({**PARAMS, "prompts": 3.0}, sort_keys=True)),
    ):
        edit(**{column: value})
        with pytest.raises(IndexMismatch):
            jobs.get(db, job.certification_id)
        edit(**{column: json.dumps(PARAMS, sort_keys=True) if column == "parameters" else
                getattr(honest, column)})  # fmt: skip
    assert jobs.get(db, job.certification_id) == honest
    forged = json.dumps({"code": "diverged", "message": "not invariant"})
    edit(state="failed", log_index=None, certificate_id=None, error=forged)
    shown = jobs.get(db, job.certification_id)
    assert shown.state == "done" and shown.error is None
    assert shown.certificate == stored.envelope and shown.log_index == stored.log_index
    # done, and an error beside it: the job is done, and a done job has no error
    edit(state="done", log_index=stored.log_index, certificate_id=job.certification_id)
    assert jobs.get(db, job.certification_id) == honest


def test_a_done_jobs_progress_and_end_are_its_certificates(db: Database) -> None:
    """A superuser edits a done job's counts and times (a live table: no trigger to drop):
    the job answers every probe its signed parameters send, and its certificate leaf's time."""
    seeded = seed_ledger(db)
    job = _create(db)
    stored = _conclude(db, seeded.log_key, job)
    with db.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE certification_jobs SET done = 3, total = 999, updated_at = :t "
                "WHERE certification_id = :i"
            ),
            {"t": utcnow() - timedelta(days=9000), "i": job.certification_id},
        )
    shown = jobs.get(db, job.certification_id)
    assert (shown.done, shown.total) == (10, 10)  # 3 prompts: twice alone, one wave of 4
    assert shown.updated_at == parse_rfc3339(stored.created_at)  # the leaf's append time
    # and its start is the one its certificate signs, whatever the row says
    with db.engine.begin() as conn:
        conn.execute(
            text("UPDATE certification_jobs SET created_at = :t WHERE certification_id = :i"),
            {"t": utcnow() - timedelta(days=9000), "i": job.certification_id},
        )
    started = _certificate(job)["started_at"]
    assert jobs.get(db, job.certification_id).created_at == parse_rfc3339(started)
    # a certificate logged before the ledger signed a start: the row's, as documented
    older = _create(db)
    body = {k: v for k, v in _certificate(older).items() if k != "started_at"}
    jobs.conclude(db, seeded.log_key, older.certification_id, "host:1:a", done=10,
                  certificate=body)  # fmt: skip
    assert jobs.get(db, older.certification_id).created_at == older.created_at


def test_one_certification_runs_per_pool_and_a_bounded_number_in_all(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second job for a pool being certified is refused (it would spoil the first's
    baseline, and a token holder could pile jobs up), until the first ends or its lease runs
    out; and no more than ``MAX_RUNNING`` run at once."""
    first = _create(db)
    with pytest.raises(Conflict) as busy:
        _create(db, pool=first.pool)
    assert busy.value.code == "certification_running"
    assert busy.value.details == {"certification_id": first.certification_id}
    assert jobs.finish(db, first.certification_id, "host:1:a", done=1, error={"code": "e"})
    second = _create(db, pool=first.pool)
    # a runner that died holds its pool until its lease runs out, then the next job starts
    after = second.lease_until + timedelta(seconds=1)
    third = _create(db, pool=first.pool, now=after)
    assert jobs.get(db, second.certification_id, now=after).state == "failed"
    assert third.state == "running"
    jobs.expire(db, after)  # the others' jobs: counted as they stand when the next is created
    with db.read() as s:
        running = s.execute(
            text("SELECT count(*) FROM certification_jobs WHERE state = 'running'")
        ).scalar_one()
    monkeypatch.setattr(jobs, "MAX_RUNNING", running + 1)
    _create(db, now=after)
    with pytest.raises(Conflict) as full:
        _create(db, now=after)
    assert full.value.code == "too_many_certifications"
    assert full.value.details["max_running"] == running + 1


def test_a_cancelled_job_fails_frees_its_pool_and_its_runner_lets_go(db: Database) -> None:
    job = _create(db)
    cancelled = jobs.cancel(db, job.certification_id, STARTER)
    assert cancelled.state == "failed" and cancelled.error is not None
    assert cancelled.error["code"] == "cancelled" and cancelled.certificate is None
    assert cancelled.error["details"]["cancelled_by"] == STARTER.token_id
    # the runner finds the job lost at its next renewal, and stops
    assert not jobs.renew(db, job.certification_id, "host:1:a", done=3, lease=LEASE)
    assert not jobs.finish(db, job.certification_id, "host:1:a", done=3, error={"code": "x"})
    assert jobs.get(db, job.certification_id) == cancelled
    _create(db, pool=job.pool)  # the pool is free
    with pytest.raises(Conflict) as ended:
        jobs.cancel(db, job.certification_id, STARTER)
    assert ended.value.code == "job_finished"
    assert ended.value.details == {"certification_id": job.certification_id, "status": "failed"}
    with pytest.raises(NotFound) as unknown:
        jobs.cancel(db, "cert-" + "0" * 32, STARTER)
    assert unknown.value.code == "job_not_found"


def test_only_the_token_that_started_a_job_or_an_admin_cancels_it(db: Database) -> None:
    """Another replay token may start jobs of its own, not end this one; a job started before
    the ledger kept its starter (no ``started_by``) is an admin's to cancel."""
    job = _create(db)
    other = Principal("tok-other", "other", ("replay",))
    with pytest.raises(PermissionDenied) as refused:
        jobs.cancel(db, job.certification_id, other)
    assert refused.value.code == "not_job_starter"
    assert refused.value.details == {"certification_id": job.certification_id}
    assert jobs.get(db, job.certification_id).state == "running"
    by_admin = jobs.cancel(db, job.certification_id, ADMIN)
    assert by_admin.error is not None and by_admin.error["details"]["cancelled_by"] == "tok-admin"
    older = _create(db, started_by=None)
    with pytest.raises(PermissionDenied):
        jobs.cancel(db, older.certification_id, STARTER)
    assert jobs.cancel(db, older.certification_id, ADMIN).state == "failed"


def test_a_job_cancelled_before_its_certificate_is_logged_logs_none(db: Database) -> None:
    """The cancel lands between the runner's last renewal and its logging: the cancel was
    answered as final, so the certificate is refused and nothing is appended."""
    seeded = seed_ledger(db)
    job = _create(db)
    cancelled = jobs.cancel(db, job.certification_id, STARTER)
    with db.read() as s:
        size = log.log_size(s)
    with pytest.raises(Conflict) as refused:
        _conclude(db, seeded.log_key, job)
    assert refused.value.code == "job_finished"
    with db.read() as s:
        assert log.log_size(s) == size
    assert jobs.get(db, job.certification_id) == cancelled


def test_a_certificate_logged_after_the_lease_ran_out_still_makes_the_job_done(
    db: Database,
) -> None:
    """The leaf is a fact: a stalled runner that did log it turns ``interrupted`` into done."""
    seeded = seed_ledger(db)
    job = _create(db)
    jobs.get(db, job.certification_id, now=job.lease_until + timedelta(seconds=1))
    stored = _conclude(db, seeded.log_key, job, invariant=False)
    done = jobs.get(db, job.certification_id)
    assert done.state == "done" and done.error is None and done.certificate == stored.envelope


def test_the_database_refuses_an_unknown_state_and_done_without_a_leaf(db: Database) -> None:
    job = _create(db)
    for values in ("state = 'paused'", "state = 'done'"):
        with pytest.raises(Conflict), db.write() as s:
            s.execute(
                text(f"UPDATE certification_jobs SET {values} WHERE certification_id = :i"),
                {"i": job.certification_id},
            )
    assert jobs.get(db, job.certification_id).state == "running"


def test_renewals_and_expiry_racing_never_both_win(db: Database) -> None:
    """Each job's runner renews while another process expires it, at the lease's edge: the
    job ends either renewed and running, or failed with the renewal refused; never a renewal
    reported as held on a job that was failed."""
    created = [_create(db) for _ in range(12)]
    outcome: dict[str, bool] = {}
    errors: list[BaseException] = []

    def runner(job: jobs.Job) -> None:
        try:
            at = job.lease_until - timedelta(milliseconds=1)
            outcome[job.certification_id] = jobs.renew(
                db, job.certification_id, "host:1:a", done=5, lease=LEASE, now=at
            )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reaper() -> None:
        try:
            for job in created:
                jobs.expire(db, job.lease_until + timedelta(milliseconds=1))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=runner, args=(j,)) for j in created]
    threads.append(threading.Thread(target=reaper))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for job in created:
        final = jobs.get(db, job.certification_id, now=job.created_at)
        if outcome[job.certification_id]:
            assert final.state == "running" and final.done == 5
        else:
            assert final.state == "failed" and final.done == 0


def _wait(check: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_process_that_lost_the_lease_stops_the_job_and_logs_nothing(api: Harness) -> None:
    """The API process stalls past its lease (simulated: the lease is moved into the past),
    and another reader fails the job; the process, at its next renewal, finds it lost and
    stops probing, and the certificate is never logged, though its worker answers again."""
    worker = add_worker(api.url, api.admin_token, delay=0.02, hold_after=2)
    try:
        client = api.client()
        started = client.post(
            "/v1/certifications",
            json={"pool": worker.pool, "prompts": 2, "concurrency": [1], "max_tokens": [4]},
        )
        assert started.status_code == 202, started.text
        job_id = started.json()["certification_id"]
        _wait(lambda: worker.received == 3 and jobs.get(api.db, job_id).done == 2)
        with api.db.write() as s:
            s.execute(
                text("UPDATE certification_jobs SET lease_until = :t WHERE certification_id = :i"),
                {"t": utcnow() - timedelta(seconds=1), "i": job_id},
            )
        failed = client.get(f"/v1/certifications/{job_id}").json()
        assert failed["status"] == "failed" and failed["error"]["code"] == "interrupted"
        app: Any = api.server.server.config.app
        running = app.state.ledger.jobs  # the runs this API process holds
        _wait(lambda: job_id not in running, timeout=15)  # its next renewal found it lost
        worker.release.set()
        time.sleep(1)
        assert worker.received == 3, "the job kept probing after it lost its lease"
        assert client.get(f"/v1/certifications/{job_id}").json() == failed
        missing = client.get(f"/v1/certificates/{job_id}")
        assert missing.status_code == 404, missing.text
    finally:
        worker.close()


def test_a_poll_of_an_unknown_job_is_404_and_of_a_malformed_id_422(api: Harness) -> None:
    """An ID no job can have is refused as a malformed ID is on every route (422)."""
    client = api.client()
    response = client.get("/v1/certifications/cert-" + "0" * 32)
    assert response.status_code == 404 and response.json()["error"]["code"] == "job_not_found"
    for job_id in ("cert-nope", "x" * 300):
        response = client.get(f"/v1/certifications/{job_id}")
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "invalid_parameters"


def test_a_worker_that_does_not_answer_fails_the_job_with_its_reason(api: Harness) -> None:
    worker = add_worker(api.url, api.admin_token)
    try:
        worker.stop_answering()  # registered and live, but nothing listens at its URL any more
        client = api.client()
        started = client.post("/v1/certifications", json={"pool": worker.pool, "prompts": 2})
        assert started.status_code == 202, started.text
        job_id = started.json()["certification_id"]
        _wait(lambda: client.get(f"/v1/certifications/{job_id}").json()["status"] != "running")
        failed = client.get(f"/v1/certifications/{job_id}").json()
        assert failed["status"] == "failed" and failed["done"] == 0, failed
        assert failed["error"]["code"] == "worker_unreachable", failed
        assert worker.worker_id in failed["error"]["message"]
    finally:
        worker.close()


def test_the_cli_follows_a_job_to_its_certificate_and_reports_a_failure(
    api: Harness, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(api.token("replay", "records:read"))
    common = ["--api", api.url, "--token-file", str(token)]
    worker = add_worker(api.url, api.admin_token, delay=0.02)
    try:
        args = ["--pool", worker.pool, "--prompts", "3", "--concurrency", "1,3"]
        proc = ledger("certify", *args, "--max-tokens", "4", *common, "--json", check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        job = json.loads(proc.stdout)
        assert job["status"] == "done" and job["done"] == job["total"] == 9
        assert job["envelope"]["body"]["invariant_observed"] is True
        worker.stop_answering()
        gone = ledger("certify", "--pool", worker.pool, *common, check=False)
        assert gone.returncode == 2, gone.stdout + gone.stderr
        assert "certification failed" in gone.stderr and "[worker_unreachable]" in gone.stderr
    finally:
        worker.close()
