"""Certification jobs: the live state of pool certifications, shared by every API process.

Not a ledger table: a job's row is updated as it runs (progress, lease, outcome). The signed
certificate a finished job produced is a log leaf, logged in the transaction that marks the
job done (:func:`conclude`); the row only points at it (``certificate_id``, ``log_index``), and
reading a done job returns that leaf's envelope, once checked to be this job's certificate
(else :class:`IndexMismatch`: a row edited to point at another leaf is never answered).

States: ``running`` (from creation: the process that accepted the job runs it), then ``done``
or ``failed``, both final (but see :func:`conclude`: a logged certificate always wins). A running
job belongs to one process, its *runner*, which holds a lease (``lease_until``) and renews it
every few seconds, writing the progress with it. A running job whose lease has expired (its
process died, or stopped without handing the job back) is failed with ``interrupted`` by
whichever process reads it next, or sweeps at start-up: no job stays ``running`` after its
runner is gone. Jobs are not resumed: the probes' results lived in the dead process, and a
certificate is one sitting on one worker; a new job is the honest way to start again.

Every change a runner makes is conditional on still holding the job (``state = running`` and
``runner`` = itself), so a runner that lost its lease neither overwrites the failure nor
reports progress. Leases compare the API hosts' clocks, which must agree within a few seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session, aliased

from ledger.certify import probe_count
from ledger.clock import parse_rfc3339, rfc3339
from ledger.errors import Conflict, IndexMismatch, NotFound, PermissionDenied
from ledger.signing import SigningKey
from ledger.storage import verdicts
from ledger.storage.database import Database, as_utc, utcnow
from ledger.storage.models import Certificate, CertificationJob, LogEntry
from ledger.storage.verdicts import CERTIFICATE_KIND
from ledger.tokens import Principal

RUNNING, DONE, FAILED = "running", "done", "failed"
MAX_RUNNING = 16  # jobs running at once, over every pool and process
STATES = (RUNNING, DONE, FAILED)
INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Job:
    """One job's row; ``certificate`` is the logged certificate's canonical envelope (done)."""

    certification_id: str
    pool: str
    worker_id: str
    fingerprint_id: str
    parameters: dict[str, Any]
    state: str
    done: int
    total: int
    error: dict[str, Any] | None
    certificate_id: str | None
    log_index: int | None
    runner: str
    lease_until: datetime
    created_at: datetime
    updated_at: datetime
    certificate: bytes | None = None

    def expired(self, now: datetime) -> bool:
        return self.state == RUNNING and self.lease_until < now


def interrupted_error(job: Job) -> dict[str, Any]:
    return {
        "code": INTERRUPTED,
        "message": "the ledger process running it stopped (its lease ran out at "
        f"{rfc3339(job.lease_until)}); start a new certification",
        "details": {"runner": job.runner, "done": job.done, "total": job.total},
    }


def _checked(
    row: CertificationJob, envelope: bytes, log_index: int | None
) -> tuple[bytes, dict[str, Any]]:
    """The certificate at ``log_index`` and its body, checked to be this job's, for its pool,
    worker, fingerprint and parameters as the row states them (else :class:`IndexMismatch`)."""
    body: dict[str, Any] = {}
    try:
        logged = json.loads(envelope)
        body = logged["body"]
        ok = logged["kind"] == CERTIFICATE_KIND
        ok = ok and body["certificate_id"] == row.certification_id
        ok = ok and (body["pool"], body["worker_id"], body["fingerprint_id"]) == (
            row.pool,
            row.worker_id,
            row.fingerprint_id,
        )
        # as JSON, not as Python values: True == 1 and 2.0 == 2 are no match
        ok = ok and _json(body["parameters"]) == _json(json.loads(row.parameters))
        if ok and "started_at" in body:
            parse_rfc3339(body["started_at"])  # ValueError: not a start this ledger signed
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise IndexMismatch(
            f"certification {row.certification_id}'s row disagrees with log entry {log_index}, "
            "its certificate: the job's row was edited (run `ledger audit`)",
            details={"certification_id": row.certification_id, "log_index": log_index},
        )
    return bytes(envelope), body


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _code(error: str | None) -> Any:
    """The code of a row's stored error (None: none, or not one the ledger wrote)."""
    try:
        return json.loads(error).get("code") if error is not None else None
    except (ValueError, AttributeError):
        return None


def _job(
    row: CertificationJob,
    pointed: bytes | None = None,
    logged_at: int | None = None,
    logged: bytes | None = None,
    pointed_time: datetime | None = None,
    logged_time: datetime | None = None,
) -> Job:
    """The job a row states, bound to the log: a done row's certificate is the leaf it points
    at (and the one the certificates index names, if any); a certificate logged for a job the
    row says is running or failed makes it done (a runner between logging its certificate and
    recording it, or an edited row: the leaf is the fact). A done job's progress and end are
    its certificate's (every probe its parameters send; its leaf's append time), not the
    row's; its parameters, and when the certificate names it its start, are the certificate's
    too."""
    state, log_index, done, total, error = row.state, row.log_index, row.done, row.total, row.error
    parameters = json.loads(row.parameters)
    updated_at, created_at = as_utc(row.updated_at), as_utc(row.created_at)
    certificate, appended = None, None
    if row.state == DONE:
        if pointed is None or (logged_at is not None and logged_at != row.log_index):
            raise IndexMismatch(
                f"certification {row.certification_id} is done without its certificate in the "
                "log: the job's row was edited (run `ledger audit`)",
                details={"certification_id": row.certification_id},
            )
        certificate, signed = _checked(row, pointed, row.log_index)
        appended = pointed_time
    elif logged is not None:
        certificate, signed = _checked(row, logged, logged_at)
        state, log_index, error, appended = DONE, logged_at, None, logged_time
    if certificate is not None:
        parameters, error = signed["parameters"], None
        done = total = probe_count(parameters)
        assert appended is not None  # read with the leaf
        updated_at = as_utc(appended)
        if isinstance(signed.get("started_at"), str):
            created_at = parse_rfc3339(signed["started_at"])
    return Job(
        certification_id=row.certification_id,
        pool=row.pool,
        worker_id=row.worker_id,
        fingerprint_id=row.fingerprint_id,
        parameters=parameters,
        state=state,
        done=done,
        total=total,
        error=json.loads(error) if error is not None else None,
        certificate_id=row.certification_id if certificate is not None else row.certificate_id,
        log_index=log_index,
        runner=row.runner,
        lease_until=as_utc(row.lease_until),
        created_at=created_at,
        updated_at=updated_at,
        certificate=certificate,
    )


def create(
    db: Database,
    *,
    certification_id: str,
    pool: str,
    worker_id: str,
    fingerprint_id: str,
    parameters: dict[str, Any],
    total: int,
    runner: str,
    lease: timedelta,
    started_by: str | None = None,
    now: datetime | None = None,
) -> Job:
    """A new job, running and leased to ``runner`` from the start; ``started_by``: the
    display ID of the token that started it (the one that may cancel it, besides admins)."""
    at = now or utcnow()
    values = {
        "certification_id": certification_id,
        "pool": pool,
        "worker_id": worker_id,
        "fingerprint_id": fingerprint_id,
        "parameters": json.dumps(parameters, sort_keys=True),
        "state": RUNNING,
        "done": 0,
        "total": total,
        "error": None,
        "certificate_id": None,
        "log_index": None,
        "runner": runner,
        "started_by": started_by,
        "lease_until": at + lease,
        "created_at": at,
        "updated_at": at,
    }
    with db.write() as s:
        _expire_in(s, at)
        running = s.execute(
            select(CertificationJob.certification_id, CertificationJob.pool).where(
                CertificationJob.state == RUNNING
            )
        ).all()
        busy = [r.certification_id for r in running if r.pool == pool]
        if busy:
            raise Conflict(
                f"pool {pool!r} is being certified by {busy[0]}: one certification runs per "
                "pool at a time (its probes' baseline runs alone); wait for it to end (GET "
                f"/v1/certifications/{busy[0]})",
                code="certification_running",
                details={"certification_id": busy[0]},
            )
        if len(running) >= MAX_RUNNING:
            raise Conflict(
                f"{len(running)} certifications are running, the most the ledger runs at once: "
                "wait for one to end",
                code="too_many_certifications",
                details={"running": len(running), "max_running": MAX_RUNNING},
            )
        s.execute(insert(CertificationJob), [values])
        row = s.get_one(CertificationJob, certification_id)
        return _job(row)


def _read(db: Database, certification_id: str) -> Job | None:
    logged = aliased(LogEntry)
    with db.read() as s:
        found = s.execute(
            select(
                CertificationJob,
                LogEntry.envelope,
                Certificate.log_index,
                logged.envelope,
                LogEntry.appended_at,
                logged.appended_at,
            )
            .outerjoin(LogEntry, LogEntry.idx == CertificationJob.log_index)
            .outerjoin(Certificate, Certificate.certificate_id == CertificationJob.certification_id)
            .outerjoin(logged, logged.idx == Certificate.log_index)
            .where(CertificationJob.certification_id == certification_id)
        ).first()
    return None if found is None else _job(*found)


def get(db: Database, certification_id: str, now: datetime | None = None) -> Job:
    """The job as it stands; a running job whose lease ran out is failed first."""
    job = _read(db, certification_id)
    if job is None:
        raise NotFound(f"no certification {certification_id!r}", code="job_not_found")
    if job.expired(now or utcnow()):
        expire(db, now, only=certification_id)
        job = _read(db, certification_id)
        assert job is not None  # job rows are never deleted
    return job


def expire(db: Database, now: datetime | None = None, *, only: str | None = None) -> list[str]:
    """Fail every running job whose lease ran out (or only job ``only``); their IDs."""
    with db.write() as s:
        # Under the write lock, so a runner's renewal and this never interleave.
        return _expire_in(s, now or utcnow(), only)


def _expire_in(s: Session, at: datetime, only: str | None = None) -> list[str]:
    q = select(CertificationJob).where(
        CertificationJob.state == RUNNING, CertificationJob.lease_until < at
    )
    if only is not None:
        q = q.where(CertificationJob.certification_id == only)
    rows = list(s.execute(q).scalars())
    for row in rows:
        row.error = json.dumps(interrupted_error(_job(row)))
        row.state, row.updated_at = FAILED, at
    return [r.certification_id for r in rows]


CANCELLED = "cancelled"


def cancel(db: Database, certification_id: str, by: Principal, now: datetime | None = None) -> Job:
    """Fail a running job as ``cancelled``, freeing its pool: its runner finds the job lost at
    its next renewal (within seconds), stops probing and logs no certificate (one already being
    logged wins: the job is done). Only the token that started the job, or an admin token,
    cancels it. NotFound; PermissionDenied ``not_job_starter``; Conflict ``job_finished``
    when it had ended."""
    at = now or utcnow()
    with db.write() as s:
        _expire_in(s, at, only=certification_id)
        row = s.get(CertificationJob, certification_id)
        if row is None:
            raise NotFound(f"no certification {certification_id!r}", code="job_not_found")
        if row.started_by != by.token_id and not by.allows("admin"):
            raise PermissionDenied(
                f"certification {certification_id} was started by another token: only that "
                "token, or an admin token, cancels it",
                code="not_job_starter",
                details={"certification_id": certification_id},
            )
        if row.state != RUNNING:
            raise Conflict(
                f"certification {certification_id} has already ended ({row.state})",
                code="job_finished",
                details={"certification_id": certification_id, "status": row.state},
            )
        row.error = json.dumps(
            {
                "code": CANCELLED,
                "message": "cancelled (POST /v1/certifications/{id}/cancel) before it finished",
                "details": {
                    "runner": row.runner,
                    "done": row.done,
                    "total": row.total,
                    "cancelled_by": by.token_id,
                },
            }
        )
        row.state, row.updated_at = FAILED, at
    return get(db, certification_id, at)


def _held(certification_id: str, runner: str) -> Any:
    return (
        (CertificationJob.certification_id == certification_id)
        & (CertificationJob.runner == runner)
        & (CertificationJob.state == RUNNING)
    )


def renew(
    db: Database,
    certification_id: str,
    runner: str,
    *,
    done: int,
    lease: timedelta,
    now: datetime | None = None,
) -> bool:
    """Extend ``runner``'s lease and record its progress; False when it no longer holds the
    job (failed by another process after its lease ran out, or finished)."""
    at = now or utcnow()
    with db.write() as s:
        held = s.execute(
            update(CertificationJob)
            .where(_held(certification_id, runner), CertificationJob.lease_until >= at)
            .values(done=done, lease_until=at + lease, updated_at=at)
        )
        return bool(held.rowcount == 1)  # type: ignore[attr-defined]


def finish(
    db: Database,
    certification_id: str,
    runner: str,
    *,
    done: int,
    error: dict[str, Any],
    now: datetime | None = None,
) -> bool:
    """Fail ``runner``'s job with ``error``; False when the runner no longer held it."""
    values: dict[str, Any] = {
        "done": done,
        "updated_at": now or utcnow(),
        "state": FAILED,
        "error": json.dumps(error),
    }
    with db.write() as s:
        held = s.execute(
            update(CertificationJob).where(_held(certification_id, runner)).values(**values)
        )
        return bool(held.rowcount == 1)  # type: ignore[attr-defined]


def conclude(
    db: Database,
    log_key: SigningKey,
    certification_id: str,
    runner: str,
    *,
    done: int,
    certificate: dict[str, Any],
    now: datetime | None = None,
) -> verdicts.Stored:
    """Log ``runner``'s certificate and mark its job done with it, in one transaction: a
    certificate is never logged without its job saying so, nor a job done without its leaf.

    The job is marked done even when the runner no longer held it (the leaf is a fact,
    whatever the row said meanwhile): ``interrupted`` is replaced by ``done`` if the runner
    turns out to have finished after all. A job cancelled meanwhile is not: its cancel was
    answered as final, so Conflict ``job_finished`` and nothing is logged.
    """

    def mark_done(s: Session, log_index: int) -> None:
        row = s.get(CertificationJob, certification_id)
        if row is not None and row.state == FAILED and _code(row.error) == CANCELLED:
            # cancelled between the runner's last renewal and now: the cancel was answered
            # as final, so no certificate is logged (raising here appends nothing)
            raise Conflict(
                f"certification {certification_id} was cancelled: no certificate is logged",
                code="job_finished",
                details={"certification_id": certification_id, "status": FAILED},
            )
        s.execute(
            update(CertificationJob)
            .where(
                CertificationJob.certification_id == certification_id,
                CertificationJob.runner == runner,
                CertificationJob.state.in_((RUNNING, FAILED)),  # held, or failed meanwhile
            )
            .values(
                done=done,
                updated_at=now or utcnow(),
                state=DONE,
                certificate_id=certificate["certificate_id"],
                log_index=log_index,
                error=None,
            )
        )

    return verdicts.append_certificate(db, log_key, certificate, then=mark_done)
