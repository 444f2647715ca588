"""Signed replay verdicts and pool certificates: appended as log leaves and indexed."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from ledger.clock import rfc3339
from ledger.disclosures import digest_of, parse, salt_keys
from ledger.errors import Gone, LedgerError, NotFound
from ledger.replay import VERDICT_KIND
from ledger.signing import SigningKey, sign_envelope
from ledger.storage import log
from ledger.storage.database import Database, as_utc, utcnow
from ledger.storage.models import Certificate, Disclosure, LogEntry, Replay, Salt
from ledger.storage.queries import (
    EVENT_ID,
    check_name,
    disclosures_at,
    logged_envelope,
    mismatch,
    record_in,
    stored_bytes,
)

CERTIFICATE_KIND = "pool_certificate"


@dataclass(frozen=True)
class Stored:
    """A logged verdict or certificate: its index row facts and the canonical envelope."""

    id: str
    log_index: int
    created_at: str
    envelope: bytes
    disclosures: tuple[str, ...] = ()  # a v2 record's replay output, until erased

    def render(self, id_name: str) -> bytes:
        meta = json.dumps(
            {id_name: self.id, "log_index": self.log_index, "created_at": self.created_at}
        ).encode()
        out = meta[:-1] + b',"envelope":' + self.envelope
        if self.disclosures:
            out += b',"disclosures":' + json.dumps(list(self.disclosures)).encode()
        return out + b"}"


def _append(
    db: Database,
    log_key: SigningKey,
    kind: str,
    body: dict[str, Any],
    model: type[Any],
    id_column: str,
    content: Sequence[tuple[str, str]] = (),
    then: Callable[[Session, int], None] | None = None,
    **row: Any,
) -> Stored:
    """Sign ``body`` with the log key, append it as a leaf and write its index row (and the
    disclosures it commits to, ``(request_id, encoded)``), at once. Content of a record erased
    in the meantime (a replay runs for up to minutes) is never stored again: Gone, and nothing
    is logged. ``then(session, log_index)`` runs in the same transaction: if it raises,
    nothing is logged."""
    env = sign_envelope(kind, body, log_key)
    with db.write() as s:  # holds the append lock, as an erasure does
        # each erasure read through its leaf (an erasures row of any other leaf is
        # IndexMismatch, never "erased")
        erased = next(
            (rid for rid in sorted({rid for rid, _ in content}) if record_in(s, rid).erasure),
            None,
        )
        if erased is not None:
            raise Gone(
                f"the content of record {erased!r} was erased while it was being replayed",
                details={"request_id": erased},
            )
        salts = [key for _, encoded in content for key in salt_keys(parse(encoded).salt)]
        _check_fresh(s, salts)
        at = utcnow()
        (idx,) = log.append(s, [env], at)
        s.execute(insert(model), [{**row, "log_index": idx, "created_at": at}])
        if content:
            s.execute(insert(Salt), [{"salt_key": k, "log_index": idx} for k in salts])
            s.execute(
                insert(Disclosure),
                [
                    {
                        "request_id": rid,
                        "digest": digest_of(encoded),
                        "log_index": idx,
                        "disclosure": encoded,
                    }
                    for rid, encoded in content
                ],
            )
        if then is not None:
            then(s, idx)
    return Stored(row[id_column], idx, rfc3339(at), env.canonical)


def _check_fresh(s: Session, salts: Sequence[bytes]) -> None:
    """Refuse content (a replay output, whose disclosure the ledger made) holding a salt the
    ledger accepted before: its own random source repeated, and a disclosure of it would
    confirm guesses of the other's content. Nothing is logged."""
    if not salts:
        return
    earlier = s.scalars(select(Salt.log_index).where(Salt.salt_key.in_(salts))).first()
    if earlier is not None:
        raise LedgerError(
            "the replay output's disclosure holds a salt the ledger accepted before "
            f"(leaf {earlier}): the ledger's random source repeated; nothing was logged",
            code="salt_reused",
            details={"log_index": earlier},
        )


def _logged(envelope: object, log_index: int, kind: str, member: str, key: str) -> dict[str, Any]:
    """The body of the leaf an index row names, which must be the ``kind`` whose ``member``
    is ``key`` (IndexMismatch otherwise, a leaf the log does not hold included: an edited row
    is never an answer, nor hidden)."""
    if envelope is None:
        raise mismatch(f"{kind} {key!r}", log_index, "the log holds no such leaf")
    data = stored_bytes(envelope)
    if data is None:
        what = f"{kind} {key!r}"
        raise mismatch(what, log_index, f"its envelope is stored as {type(envelope).__name__}")
    env, _ = logged_envelope(data, log_index, kind)
    body: dict[str, Any] = env["body"]
    if body.get(member) != key:
        raise mismatch(f"{kind} {key!r}", log_index, f"the leaf is the {kind} of another {member}")
    return body


def _get(db: Database, model: type[Any], column: Any, key: str, what: str, kind: str) -> Stored:
    """A verdict or certificate as logged, and the replay output its leaf commits to (each
    disclosure must open the leaf's ``output_digest``)."""
    check_name(key, EVENT_ID, f"a {what} ID is 1-200 characters of A-Z a-z 0-9 . _ : -")
    with db.read() as s:
        found = s.execute(
            select(model, LogEntry.envelope, LogEntry.appended_at)
            .outerjoin(LogEntry, LogEntry.idx == model.log_index)
            .where(column == key)
        ).first()
        if found is None:
            raise NotFound(f"no {what} {key!r}", code=f"{what}_not_found")
        row, envelope, appended_at = found
        body = _logged(envelope, row.log_index, kind, column.key, key)
        content = tuple(disclosures_at(s, [row.log_index]).get(row.log_index, ()))
        if not content and isinstance(body.get("output_digest"), str):
            _output_erased(s, body, f"the output of {what} {key!r}", row.log_index)
    for encoded in content:
        if digest_of(encoded) != body.get("output_digest"):
            raise mismatch(
                f"the output of {what} {key!r}", row.log_index, "a disclosure opens no digest"
            )
    # the time the leaf was appended (the audit checks each checkpoint covers it), not the row's
    return Stored(key, row.log_index, rfc3339(as_utc(appended_at)), envelope, content)


def _output_erased(s: Session, body: dict[str, Any], what: str, log_index: int) -> None:
    """A verdict's output is missing only when its record's erasure event erased it (read
    through its leaf): otherwise the disclosure was deleted without a logged erasure, and the
    verdict is never served as if its output were erased."""
    record = record_in(s, str(body.get("request_id")))
    erased = record.erasure.body.get("erased_digests") if record.erasure is not None else None
    if not isinstance(erased, list) or body["output_digest"] not in erased:
        raise mismatch(
            what,
            log_index,
            "its stored disclosure is missing and no erasure event of its record names it",
        )


def append_verdict(
    db: Database, log_key: SigningKey, body: dict[str, Any], content: Sequence[str] = ()
) -> Stored:
    """Log a verdict; ``content``: the ``replay_output`` disclosure its ``output_digest``
    commits to (a replay of a v2 record)."""
    return _append(
        db,
        log_key,
        VERDICT_KIND,
        body,
        Replay,
        "replay_id",
        [(body["request_id"], encoded) for encoded in content],
        replay_id=body["replay_id"],
        request_id=body["request_id"],
        verdict=body["verdict"],
        pool=body["pool"],
        worker_id=body["worker_id"],
    )


def get_verdict(db: Database, replay_id: str) -> Stored:
    return _get(db, Replay, Replay.replay_id, replay_id, "replay", VERDICT_KIND)


def verdicts_of(db: Database, request_id: str) -> list[dict[str, Any]]:
    """A record's replays, oldest first (summary rows; fetch one for its envelope)."""
    with db.read() as s:
        rows = s.execute(
            select(Replay, LogEntry.envelope, LogEntry.appended_at)
            .outerjoin(LogEntry, LogEntry.idx == Replay.log_index)
            .where(Replay.request_id == request_id)
            .order_by(Replay.log_index)
        ).all()
    out = []
    # Each summary is read from its leaf, never from the index row.
    for r, envelope, appended_at in rows:
        body = _logged(envelope, r.log_index, VERDICT_KIND, "replay_id", r.replay_id)
        if body.get("request_id") != request_id:
            raise mismatch(
                f"replay {r.replay_id!r}", r.log_index, "the verdict is about another record"
            )
        out.append(
            {
                "replay_id": r.replay_id,
                "verdict": body.get("verdict"),
                "pool": body.get("pool"),
                "worker_id": body.get("worker_id"),
                "log_index": r.log_index,
                "created_at": rfc3339(as_utc(appended_at)),
            }
        )
    return out


def append_certificate(
    db: Database,
    log_key: SigningKey,
    body: dict[str, Any],
    then: Callable[[Session, int], None] | None = None,
) -> Stored:
    """Log a pool certificate; ``then(session, log_index)`` runs in the same transaction (the
    job that produced it marked done: never one without the other)."""
    return _append(
        db,
        log_key,
        CERTIFICATE_KIND,
        body,
        Certificate,
        "certificate_id",
        then=then,
        certificate_id=body["certificate_id"],
        pool=body["pool"],
        fingerprint_id=body["fingerprint_id"],
        invariant=body["invariant_observed"],
    )


def get_certificate(db: Database, certificate_id: str) -> Stored:
    return _get(
        db, Certificate, Certificate.certificate_id, certificate_id, "certificate", CERTIFICATE_KIND
    )


def latest_certificate(db: Database, pool: str) -> dict[str, Any] | None:
    """The body of a pool's latest certificate, read from its log leaf (None: never
    certified); a leaf that is not a certificate of that pool (an edited index) is None."""
    with db.read() as s:
        found = s.execute(
            select(LogEntry.envelope)
            .join(Certificate, Certificate.log_index == LogEntry.idx)
            .where(Certificate.pool == pool)
            .order_by(Certificate.log_index.desc())
            .limit(1)
        ).scalar_one_or_none()
    data = stored_bytes(found)
    if data is None:  # never certified, or its leaf stored as another type (an edit)
        return None
    env = json.loads(data)
    body = env.get("body") if isinstance(env, dict) else None
    if (
        env.get("kind") != CERTIFICATE_KIND
        or not isinstance(body, dict)
        or body.get("pool") != pool
    ):
        return None
    return body
