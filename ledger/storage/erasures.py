"""Erasing records' content, legal holds and the retention purge (``ledger.erasure`` bodies).

An erasure is one transaction: the erasure event is signed by the log key and appended, its
``erasures`` row written, then the record's disclosures (and those of its replay outputs) and
its cache-key rows deleted; the database triggers refuse those deletes for a request ID that
``erasures`` does not hold. Records under a legal hold are never erased: a single erasure is
refused (409 ``legal_hold``); a bulk erasure or the retention purge skips them and says so.
Schema v1 records hold their content in their leaf and cannot be erased (409
``not_erasable``).

An ``erasures`` row is read only through the leaf it names (``queries.logged_erasure``): a
row that is not its record's logged erasure event is ``index_mismatch``, never an erasure
already done, and never a reason to pass a record over. Holds and their releases are read
from their leaves alone (``_logged_holds``), so no edit of the ``holds`` or ``hold_releases``
rows lifts a hold, places one or releases one twice. An erasure checks that the content it
erases is all stored (``_checked_content``): no event ever covers content deleted without one.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, delete, exists, insert, or_, select, text
from sqlalchemy.orm import Session, aliased

from ledger.clock import rfc3339
from ledger.erasure import (
    ERASURE_KIND,
    HOLD_KIND,
    RELEASE_KIND,
    HoldScope,
    check_hold_id,
    check_reason,
    erasure_body,
    hold_body,
    release_body,
)
from ledger.errors import Conflict, InvalidInput, NotFound
from ledger.replay import VERDICT_KIND
from ledger.signing import SigningKey, sign_envelope
from ledger.storage import log
from ledger.storage.database import Database, utcnow
from ledger.storage.models import (
    HOLD_LEAVES,
    CacheKey,
    Disclosure,
    Erasure,
    Hold,
    HoldRelease,
    LogEntry,
    Record,
    Replay,
)
from ledger.storage.queries import (
    RecordFilter,
    StoredRecord,
    filtered,
    from_log,
    mismatch,
    record_erasure,
    record_in,
    stored_bytes,
)

# Records erased per transaction by a bulk erasure or the retention purge.
CHUNK = 500


@dataclass(frozen=True)
class Erased:
    request_id: str
    status: str  # "erased" | "already_erased"
    log_index: int  # the erasure event's leaf
    erased_digests: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "status": self.status,
            "log_index": self.log_index,
            "erased_digests": self.erased_digests,
        }


@dataclass
class BulkResult:
    """What a bulk erasure or purge did (or, dry run, would do)."""

    dry_run: bool
    erased: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    not_erasable: int = 0  # schema v1 records matched (records already erased are not)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "erased": self.erased,
            "held": self.held,
            "not_erasable": self.not_erasable,
        }


@dataclass(frozen=True)
class _LoggedHold:
    """A hold as the log holds it: its placement leaf and body, and the leaf of its first
    release logged after it (None while it holds)."""

    log_index: int
    body: dict[str, Any]
    released_at: int | None


def _leaf_body(idx: int, envelope: object, kind: str) -> dict[str, Any] | None:
    """The body of a leaf whose envelope is of ``kind`` (None for any other leaf: its
    ``log_entries.kind`` was edited, which the audit names). An envelope SQLite hands back as
    another type than bytes (stored as text by an edit) is index_mismatch: read as no hold, it
    would let a held record be erased."""
    data = stored_bytes(envelope)
    if data is None:
        raise mismatch(
            f"a {kind} leaf", idx, f"its envelope is stored as {type(envelope).__name__}"
        )
    try:
        leaf = json.loads(data)
        body = leaf["body"] if leaf["kind"] == kind else None
        return body if isinstance(body, dict) and isinstance(body.get("hold_id"), str) else None
    except (ValueError, KeyError, TypeError):
        return None


def _logged_holds(session: Session) -> dict[str, _LoggedHold]:
    """Every hold the log holds, in log order, read from the hold and release leaves alone
    (found through their kind's index): the ``holds`` and ``hold_releases`` rows are never
    read for an answer. A release counts only for a hold placed before it.

    Those rows are a tripwire, though: a hold or release leaf one of them names that the
    kind's index does not find (``log_entries.kind`` or the index edited, to hide a hold from
    an erasure) is index_mismatch, so hiding a hold takes a second edit, of the rows too
    (either is named by the audit). A row naming a leaf that is no hold changes nothing."""
    holds: dict[str, _LoggedHold] = {}
    found: set[int] = set()
    for idx, kind, envelope in session.execute(
        select(LogEntry.idx, LogEntry.kind, LogEntry.envelope)
        .where(text(HOLD_LEAVES))
        .order_by(LogEntry.idx)
    ):
        body = _leaf_body(idx, envelope, kind)
        if body is None:
            continue
        found.add(idx)
        hold_id = body["hold_id"]
        if kind == HOLD_KIND:
            holds.setdefault(hold_id, _LoggedHold(idx, body, None))
        elif hold_id in holds and holds[hold_id].released_at is None:
            holds[hold_id] = replace(holds[hold_id], released_at=idx)
    named = select(Hold.log_index).union_all(select(HoldRelease.log_index))
    unfound = [i for i in session.execute(named).scalars() if i not in found and type(i) is int]
    if unfound:  # rows an edit inserted (no hold: changes nothing), or holds hidden
        for idx, envelope in session.execute(
            select(LogEntry.idx, LogEntry.envelope).where(LogEntry.idx.in_(unfound))
        ):
            if _is_hold_leaf(envelope):
                raise mismatch(
                    "a legal hold", idx, "the hold leaves' index does not find this hold leaf"
                )
    return holds


def _is_hold_leaf(envelope: object) -> bool:
    """Whether a leaf holds a hold or release envelope, however it is stored."""
    try:
        leaf = json.loads(envelope if isinstance(envelope, str) else stored_bytes(envelope) or b"")
        return isinstance(leaf, dict) and leaf.get("kind") in (HOLD_KIND, RELEASE_KIND)
    except ValueError:
        return False


def _placed(hold: Hold, envelope: bytes) -> dict[str, Any]:
    """The logged body of the hold a ``holds`` row names: the leaf must be that hold's
    placement, and the row's request ID and filter the ones it logged (index_mismatch
    otherwise: a release is never logged beside a row that disagrees with the log)."""
    try:
        leaf = json.loads(bytes(envelope))
        body: dict[str, Any] = leaf["body"]
        flt = body.get("filter")
        agrees = (
            leaf["kind"] == HOLD_KIND
            and body["hold_id"] == hold.hold_id
            and body.get("request_id") == hold.request_id
            and (json.dumps(flt, sort_keys=True) if flt else None) == hold.filter
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        agrees = False
    if not agrees:
        raise mismatch(
            f"hold {hold.hold_id!r}", hold.log_index, "the leaf is not this hold as it was placed"
        )
    return body


def active_holds(session: Session) -> list[HoldScope]:
    """Holds placed and not released, as the log holds them."""
    return [HoldScope.of(h.body) for h in _logged_holds(session).values() if h.released_at is None]


def holding(holds: Sequence[HoldScope], record: StoredRecord) -> HoldScope | None:
    for hold in holds:
        if hold.covers(
            request_id=record.request_id,
            model=record.model,
            fingerprint_id=record.fingerprint_id,
            pool=record.pool,
            tier=record.tier,
            received_at=record.received_at,
        ):
            return hold
    return None


def _content_of(ids: Sequence[str]) -> ColumnElement[bool]:
    """The disclosure rows that hold the content of records ``ids``: their own, and their
    replays' outputs (stored at the verdicts' leaves)."""
    return or_(
        Disclosure.request_id.in_(ids),
        Disclosure.log_index.in_(select(Replay.log_index).where(Replay.request_id.in_(ids))),
    )


def _checked_content(session: Session, records: Sequence[StoredRecord]) -> dict[str, set[str]]:
    """Per record, the digests its content is committed to in the log (``_committed``), once
    the stored disclosures are seen to be exactly those: a row that no signed document commits
    to (inserted), or a committed digest with no row (content deleted without a logged
    erasure), is index_mismatch. So an erasure never logs an event over content someone else
    removed, which would make that deletion look like its own (the audit names it only while
    no erasure event covers it)."""
    if not records:
        return {}
    committed = _committed(session, records)
    stored: dict[str, set[str]] = {rid: set() for rid in committed}
    for rid, verdict_of, digest, index in session.execute(
        select(Disclosure.request_id, Replay.request_id, Disclosure.digest, Disclosure.log_index)
        .outerjoin(Replay, Replay.log_index == Disclosure.log_index)
        .where(_content_of(list(committed)))
    ):
        owner = verdict_of or rid
        if digest not in committed.get(owner, ()):
            # an inserted row: never named in a signed event, nor deleted before the audit
            # has seen it
            raise mismatch(
                f"the disclosures of record {owner!r}",
                index if type(index) is int else -1,
                "a disclosure row holds a digest that neither the record nor its replay "
                "verdicts commit to",
                request_id=owner,
            )
        stored[owner].add(digest)
    for record in records:
        missing = committed[record.request_id] - stored[record.request_id]
        if missing:
            raise mismatch(
                f"the disclosures of record {record.request_id!r}",
                record.log_index,
                f"{len(missing)} of the digests it and its replay verdicts commit to have no "
                "stored disclosure, and no erasure event covers them: content was deleted "
                "without a logged erasure",
                request_id=record.request_id,
            )
    return committed


def _erase_in(
    session: Session,
    log_key: SigningKey,
    records: Sequence[StoredRecord],
    committed: dict[str, set[str]],
    *,
    reason_code: str,
    reason: str,
    requested_by: str,
) -> list[Erased]:
    """Append one erasure event per record and delete its content (one transaction);
    ``committed``: what ``_checked_content`` found for them in this transaction."""
    if not records:
        return []
    ids = [r.request_id for r in records]
    at = utcnow()  # the event's time is its leaf's: erased_at is appended_at
    bodies = [
        erasure_body(
            request_id=r.request_id,
            log_index=r.log_index,
            content_hash=r.content_hash,
            erased_digests=sorted(committed[r.request_id]),
            reason_code=reason_code,
            reason=reason,
            requested_by=requested_by,
            erased_at=rfc3339(at),
        )
        for r in records
    ]
    indexes = log.append(session, [sign_envelope(ERASURE_KIND, b, log_key) for b in bodies], at)
    session.execute(
        insert(Erasure),
        [
            {"request_id": rid, "log_index": idx, "reason_code": reason_code, "created_at": at}
            for rid, idx in zip(ids, indexes, strict=True)
        ],
    )
    session.execute(delete(Disclosure).where(_content_of(ids)))
    session.execute(delete(CacheKey).where(CacheKey.request_id.in_(ids)))
    return [
        Erased(b["request_id"], "erased", idx, len(b["erased_digests"]))
        for b, idx in zip(bodies, indexes, strict=True)
    ]


def _committed(session: Session, records: Sequence[StoredRecord]) -> dict[str, set[str]]:
    """Per record, the digests its content is committed to in the log: its body's (read
    through its leaf) and the ``output_digest`` of each of its replay verdicts, read from the
    verdicts' leaves (a ``replays`` row naming a leaf that is no verdict of the record is
    index_mismatch)."""
    committed = {r.request_id: set(r.record.digests) for r in records}
    for rid, index, envelope in session.execute(
        select(Replay.request_id, Replay.log_index, LogEntry.envelope)
        .outerjoin(LogEntry, LogEntry.idx == Replay.log_index)
        .where(Replay.request_id.in_(list(committed)))
    ):
        try:
            leaf = json.loads(bytes(envelope)) if envelope is not None else None
            about = leaf["body"]["request_id"] if leaf and leaf["kind"] == VERDICT_KIND else None
            digest = leaf["body"].get("output_digest") if about == rid else None
        except (ValueError, KeyError, TypeError, AttributeError):
            about = digest = None
        if about != rid:
            raise mismatch(
                f"a replay of record {rid!r}",
                index if type(index) is int else -1,
                "the leaf is not a replay verdict about this record",
                request_id=rid,
            )
        if isinstance(digest, str):
            committed[rid].add(digest)
    return committed


def _already(record: StoredRecord) -> Erased | None:
    """The record's erasure, as its logged event says (``record_in`` read it through its
    leaf: an ``erasures`` row naming any other leaf raised ``index_mismatch`` there)."""
    event = record.erasure
    if event is None:
        return None
    digests = len(event.body["erased_digests"])
    return Erased(record.request_id, "already_erased", event.log_index, digests)


def erase(
    db: Database, log_key: SigningKey, request_id: str, *, reason: str, requested_by: str
) -> Erased:
    """Erase one record's content on request (NotFound, Conflict ``not_erasable`` or
    ``legal_hold``; an already erased record answers its erasure, ``already_erased``)."""
    with db.write() as s:
        record = record_in(s, request_id)
        done = _already(record)
        if done is not None:
            return done
        if not record.record.erasable:
            raise Conflict(
                f"record {request_id!r} is schema v1: its content is inside its log leaf and "
                "cannot be erased",
                code="not_erasable",
            )
        hold = holding(active_holds(s), record)
        if hold is not None:
            raise Conflict(
                f"record {request_id!r} is under legal hold {hold.hold_id}",
                code="legal_hold",
                details={"hold_id": hold.hold_id},
            )
        (erased,) = _erase_in(
            s,
            log_key,
            [record],
            _checked_content(s, [record]),
            reason_code="request",
            reason=reason,
            requested_by=requested_by,
        )
    db.scrub()  # committed: cut the write-ahead log that still held the content
    return erased


def _candidates(
    session: Session,
    flt: RecordFilter,
    after: int,
    before: datetime | None,
    limit: int,
    with_content: bool = False,
) -> list[StoredRecord]:
    """Records past log index ``after``, in log order, that match ``flt`` as logged (and were
    received before ``before``), with their erasure event read through its leaf when
    ``erasures`` holds a row for them (``StoredRecord.erasure``: the caller passes those
    over). ``with_content``: only those with a stored disclosure, so never a schema v1 record
    (its content is in its leaf) nor one already erased, which the hourly purge would
    otherwise read and parse again on every run (a record whose content is gone has nothing
    left to purge, whatever ``erasures`` says: the audit names content deleted without its
    logged erasure).

    An ``erasures`` row that is not its record's logged erasure event fails the run with
    ``index_mismatch`` (before this page erases anything; pages before it stay erased): the
    record is neither passed over as erased, which would keep its content past every purge
    with no event saying why, nor erased again beside a row the audit must still find."""
    event = aliased(LogEntry)
    q = (
        select(
            LogEntry.idx,
            LogEntry.envelope,
            LogEntry.appended_at,
            Erasure.log_index.label("erasure_index"),
            event.envelope.label("erasure_envelope"),
        )
        .join(Record, Record.log_index == LogEntry.idx)
        .outerjoin(Erasure, Erasure.request_id == Record.request_id)
        .outerjoin(event, event.idx == Erasure.log_index)
        .where(LogEntry.idx > after)
        .order_by(LogEntry.idx)
        .limit(limit)
    )
    if with_content:
        q = q.where(exists().where(Disclosure.log_index == LogEntry.idx))
    if before is not None:
        q = q.where(LogEntry.appended_at < before)
    q = filtered(q, flt, LogEntry.appended_at)
    out = []
    for r in session.execute(q):
        stored = from_log(r.idx, r.envelope, r.appended_at)
        if r.erasure_index is not None:
            erasure = record_erasure(stored, r.erasure_index, r.erasure_envelope)
            stored = stored.with_disclosures((), erasure=erasure)
        out.append(stored)
    return out


def _scan(
    db: Database, flt: RecordFilter, before: datetime | None, with_content: bool
) -> Generator[tuple[Session, list[StoredRecord]], None, None]:
    after = -1
    while True:
        with db.write() as s:
            page = _candidates(s, flt, after, before, CHUNK, with_content)
            if not page:
                return
            after = page[-1].log_index
            yield s, page


def erase_matching(
    db: Database,
    log_key: SigningKey,
    flt: RecordFilter,
    *,
    reason: str,
    requested_by: str,
    reason_code: str = "request",
    dry_run: bool = False,
    before: datetime | None = None,
    progress: Callable[[int], None] | None = None,
    with_content: bool = False,
) -> BulkResult:
    """Erase every erasable record that matches ``flt`` as logged (and, for retention, was
    received before ``before``), CHUNK records per transaction, skipping held ones. A dry run
    lists exactly what a run would erase, and writes nothing. ``with_content``: read only
    records with stored content (then ``not_erasable`` stays 0: v1 records are not read)."""
    flt.check()
    check_reason(reason)  # a dry run answers as the run would, even when nothing matches
    result = BulkResult(dry_run)
    scan = _scan(db, flt, before, with_content)
    try:
        for s, page in scan:
            holds = active_holds(s)
            todo = []
            for stored in page:
                # the index only selects candidates: the filter and the cutoff are decided on the
                # receive time as read with the record, never on the SQL comparison alone
                if not flt.matches(stored) or (before is not None and stored.received_at >= before):
                    continue
                if stored.erasure is not None:  # erased already: not matched, not counted
                    continue
                if not stored.record.erasable:
                    result.not_erasable += 1
                elif holding(holds, stored) is not None:
                    result.held.append(stored.request_id)
                else:
                    todo.append(stored)
            committed = _checked_content(s, todo)  # a dry run fails where the run would
            if not dry_run:
                _erase_in(
                    s,
                    log_key,
                    todo,
                    committed,
                    reason_code=reason_code,
                    reason=reason,
                    requested_by=requested_by,
                )
            result.erased.extend(r.request_id for r in todo)
            if progress is not None:
                progress(len(todo))
    finally:
        scan.close()  # the open transaction ends (rolled back on an error) before the cut
        if not dry_run and result.erased:
            db.scrub()  # cut the write-ahead log that still held the content
    return result


def purge_expired(
    db: Database,
    log_key: SigningKey,
    days: int,
    *,
    now: datetime | None = None,
    progress: Callable[[int], None] | None = None,
) -> BulkResult:
    """The retention purge: erase the content of every record received more than ``days``
    ago, as ``retention`` erasure events, except what a legal hold covers."""
    if days < 1:
        raise InvalidInput("a retention is at least one day", code="invalid_parameters")
    cutoff = (now or utcnow()) - timedelta(days=days)
    return erase_matching(
        db,
        log_key,
        RecordFilter(),
        reason=f"retention: content older than {days} days",
        requested_by="retention",
        reason_code="retention",
        before=cutoff,
        progress=progress,
        with_content=True,
    )


def place_hold(
    db: Database,
    log_key: SigningKey,
    *,
    request_id: str | None,
    filter: dict[str, Any] | None,
    reason: str,
    placed_by: str,
) -> dict[str, Any]:
    """Place a legal hold (a logged event); answers its ID and leaf. Its signed time is the
    time its leaf is appended at, read under the append lock (never before a leaf before it)."""
    hold_id = "hold-" + secrets.token_hex(12)
    with db.write() as s:
        at = utcnow()
        body = hold_body(
            hold_id=hold_id,
            request_id=request_id,
            filter=filter,
            reason=reason,
            placed_by=placed_by,
            placed_at=rfc3339(at),
        )
        env = sign_envelope(HOLD_KIND, body, log_key)
        (idx,) = log.append(s, [env], at)
        s.execute(
            insert(Hold),
            [
                {
                    "hold_id": body["hold_id"],
                    "log_index": idx,
                    "request_id": request_id,
                    "filter": json.dumps(body["filter"], sort_keys=True)
                    if body["filter"]
                    else None,
                    "created_at": at,
                }
            ],
        )
    return {"hold_id": body["hold_id"], "log_index": idx, "placed_at": body["placed_at"]}


def release_hold(
    db: Database, log_key: SigningKey, hold_id: str, *, reason: str, released_by: str
) -> dict[str, Any]:
    """Release a placed hold (a logged event). Whether it is placed and released is the
    log's answer; its rows must agree with the log before the release and its row are
    written (index_mismatch otherwise, and nothing is logged)."""
    check_hold_id(hold_id)
    check_reason(reason)
    with db.write() as s:
        logged = _logged_holds(s).get(hold_id)
        if logged is None:
            raise NotFound(f"no hold {hold_id!r}", code="hold_not_found")
        if logged.released_at is not None:
            raise Conflict(f"hold {hold_id!r} is already released", code="hold_released")
        hold = s.get(Hold, hold_id)
        if hold is None or hold.log_index != logged.log_index:
            raise mismatch(
                f"hold {hold_id!r}",
                logged.log_index,
                "the holds table has no row for this placement",
            )
        placement = s.get(LogEntry, logged.log_index)
        assert placement is not None  # read just now, in this transaction
        _placed(hold, placement.envelope)
        if s.get(HoldRelease, hold_id) is not None:
            raise mismatch(
                f"the release of hold {hold_id!r}",
                logged.log_index,
                "a hold_releases row names a release the log does not hold",
            )
        at = utcnow()
        body = release_body(
            hold_id=hold_id, reason=reason, released_by=released_by, released_at=rfc3339(at)
        )
        (idx,) = log.append(s, [sign_envelope(RELEASE_KIND, body, log_key)], at)
        s.execute(insert(HoldRelease), [{"hold_id": hold_id, "log_index": idx, "created_at": at}])
    return {"hold_id": hold_id, "log_index": idx, "released_at": body["released_at"]}


def list_holds(db: Database) -> list[dict[str, Any]]:
    """Every hold, placed and released, as the log holds it, in log order."""
    with db.read() as s:
        holds = _logged_holds(s)
    return [
        {
            "hold_id": hold_id,
            "log_index": h.log_index,
            "request_id": h.body.get("request_id"),
            "filter": h.body.get("filter"),
            "placed_at": h.body.get("placed_at"),
            "released": h.released_at is not None,
        }
        for hold_id, h in holds.items()
    ]


def erasure_of(db: Database, request_id: str) -> bytes | None:
    """The canonical erasure event envelope of a record, if it was erased, read through
    the leaf its ``erasures`` row names (NotFound; IndexMismatch for a row naming any
    other leaf)."""
    with db.read() as s:
        event = record_in(s, request_id).erasure
    return event.envelope if event is not None else None
