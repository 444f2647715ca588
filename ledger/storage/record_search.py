"""Record search with every filter a person asks for, each fact re-derived from the log.

:func:`search` takes the filters of :class:`ledger.storage.queries.RecordFilter` (time range,
model, fingerprint, tier, pool) with the worker, ``aborted``, the record's replay verdicts, its
content state (``complete``, ``erased``, ``in_log`` for a schema v1 record) and whether a legal
hold covers it, and can walk the log newest first. Index tables only select candidates: every
hit is built from its log entry; its verdicts are read from the logged verdict envelopes (not
the ``replays`` index), its erasure state from the ``erasures`` rows ``ledger audit``
recomputes from the log and checked against its stored content, and holds from their logged
bodies. A candidate whose logged facts do not satisfy the filter is dropped: the scan fills
its place from the rows after it, up to ``MAX_DROPPED`` rows beyond the page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from ledger.compare import VERDICTS
from ledger.erasure import HoldScope
from ledger.errors import IndexMismatch, InvalidInput
from ledger.replay import VERDICT_KIND
from ledger.storage import queries
from ledger.storage.database import Database
from ledger.storage.erasures import active_holds, holding
from ledger.storage.models import Erasure, LogEntry, Record, Replay
from ledger.storage.queries import (
    MAX_PAGE,
    NAME,
    RecordFilter,
    StoredRecord,
    decode_cursor,
    encode_cursor,
    from_log,
    with_content,
)

CONTENT_STATES = ("complete", "erased", "in_log")
NO_VERDICT = "none"  # the verdict filter's value for records never replayed
Content = Literal["complete", "erased", "in_log"]


@dataclass(frozen=True)
class SearchFilter:
    """Every filter a search takes; None means "any"."""

    records: RecordFilter = field(default_factory=RecordFilter)
    worker_id: str | None = None
    aborted: bool | None = None
    verdict: str | None = None  # a verdict any logged replay of the record has, or "none"
    content: Content | None = None
    held: bool | None = None

    def check(self) -> None:
        self.records.check()
        if self.worker_id is not None and not NAME.fullmatch(self.worker_id):
            raise InvalidInput(
                "worker_id must be 1-100 characters of A-Z a-z 0-9 . _ -",
                code="invalid_parameters",
            )
        if self.verdict is not None and self.verdict not in (*VERDICTS, NO_VERDICT):
            raise InvalidInput(
                f"verdict must be one of {[*VERDICTS, NO_VERDICT]}", code="invalid_parameters"
            )
        if self.content is not None and self.content not in CONTENT_STATES:
            raise InvalidInput(
                f"content must be one of {list(CONTENT_STATES)}", code="invalid_parameters"
            )


@dataclass(frozen=True)
class Hit:
    """A record as logged, with its logged verdicts (oldest first) and the hold covering it."""

    record: StoredRecord
    verdicts: tuple[str, ...]
    held_by: str | None

    @property
    def verdict(self) -> str | None:
        """The latest verdict, if the record was ever replayed."""
        return self.verdicts[-1] if self.verdicts else None

    def meta(self) -> dict[str, object]:
        return {**self.record.meta(), "verdict": self.verdict, "held_by": self.held_by}


@dataclass(frozen=True)
class SearchPage:
    items: list[Hit]
    next_cursor: str | None


def logged_verdicts(session: Session, records: list[StoredRecord]) -> dict[str, tuple[str, ...]]:
    """Each record's verdicts, oldest first, read from the verdict leaves themselves; a leaf
    that is not a verdict about that record (an edited index row) is left out."""
    out: dict[str, list[str]] = {r.request_id: [] for r in records}
    ids = sorted(out)
    for start in range(0, len(ids), 500):
        rows = session.execute(
            select(Replay.request_id, LogEntry.envelope)
            .join(LogEntry, LogEntry.idx == Replay.log_index)
            .where(Replay.request_id.in_(ids[start : start + 500]))
            .order_by(Replay.log_index)
        )
        for request_id, envelope in rows:
            try:
                env = json.loads(bytes(envelope))
                body = env["body"]
                if env["kind"] == VERDICT_KIND and body["request_id"] == request_id:
                    out[request_id].append(str(body["verdict"]))
            except (ValueError, KeyError, TypeError):
                continue
    return {k: tuple(v) for k, v in out.items()}


def _held_by(holds: list[HoldScope], record: StoredRecord) -> str | None:
    hold = holding(holds, record)
    return hold.hold_id if hold is not None else None


class _Matcher:
    """The filters that need more than the record's envelope, applied to one batch."""

    def __init__(self, session: Session, flt: SearchFilter) -> None:
        self.session, self.flt = session, flt
        self.holds = active_holds(session)

    def keep(self, batch: list[StoredRecord]) -> list[Hit]:
        flt = self.flt
        batch = [
            r
            for r in batch
            if (flt.worker_id is None or r.worker_id == flt.worker_id)
            and (flt.aborted is None or r.aborted == flt.aborted)
        ]
        if not batch:
            return []
        verdicts = logged_verdicts(self.session, batch)
        hits = []
        for record in with_content(self.session, batch):
            try:
                record.check_content()
            except IndexMismatch:  # content the erasure index contradicts: never served
                continue
            if flt.content is not None and record.content != flt.content:
                continue
            held_by = _held_by(self.holds, record)
            if flt.held is not None and (held_by is not None) != flt.held:
                continue
            logged = verdicts.get(record.request_id, ())
            if flt.verdict == NO_VERDICT and logged:
                continue
            if flt.verdict not in (None, NO_VERDICT) and flt.verdict not in logged:
                continue
            hits.append(Hit(record, logged, held_by))
        return hits


def _candidates(flt: SearchFilter):  # type: ignore[no-untyped-def]
    q = select(LogEntry.idx, LogEntry.envelope, LogEntry.appended_at).join_from(
        Record, LogEntry, LogEntry.idx == Record.log_index
    )
    q = queries.filtered(q, flt.records, Record.received_at)
    if flt.worker_id is not None:
        q = q.where(Record.worker_id == flt.worker_id)
    erased = exists().where(Erasure.request_id == Record.request_id)
    if flt.content == "erased":
        q = q.where(erased)
    elif flt.content is not None:
        q = q.where(~erased)
    replayed = exists().where(Replay.request_id == Record.request_id)
    if flt.verdict == NO_VERDICT:
        q = q.where(~replayed)
    elif flt.verdict is not None:
        q = q.where(replayed.where(Replay.verdict == flt.verdict))
    return q


def search(
    db: Database,
    flt: SearchFilter,
    *,
    limit: int = 100,
    cursor: str | None = None,
    newest_first: bool = False,
) -> SearchPage:
    """Records matching every filter, in log order (or newest first); ``next_cursor``
    continues the scan in the same order. A page may be short, even empty, while
    ``next_cursor`` is set: follow it until it is null. The cursor is the log index of the last
    row scanned."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit must be 1..{MAX_PAGE}", code="invalid_limit")
    flt.check()
    after = decode_cursor(cursor) if cursor is not None else None
    q = _candidates(flt).order_by(Record.log_index.desc() if newest_first else Record.log_index)
    hits: list[Hit] = []
    scanned = 0
    more = False
    with db.read() as s:
        matcher = _Matcher(s, flt)
        while True:
            want = limit - len(hits)
            page_q = q
            if after is not None:
                page_q = q.where(
                    Record.log_index < after if newest_first else Record.log_index > after
                )
            rows = s.execute(page_q.limit(want + 1)).all()
            batch = []
            for row in rows[:want]:
                if row.idx == after:  # two index rows on one entry: serve it once
                    continue
                after = row.idx
                scanned += 1
                try:
                    record = from_log(row.idx, row.envelope, row.appended_at)
                except IndexMismatch:
                    continue
                if flt.records.matches(record):
                    batch.append(record)
            hits.extend(matcher.keep(batch))
            more = len(rows) > want
            if not more or len(hits) >= limit or scanned - len(hits) > queries.MAX_DROPPED:
                break
    return SearchPage(hits[:limit], encode_cursor(after) if more and after is not None else None)


def hit_of(db: Database, request_id: str) -> Hit:
    """One record by request ID, as a search would show it (its logged verdicts and the hold
    covering it); NotFound, or IndexMismatch when the index contradicts the log."""
    queries.check_request_id(request_id)
    with db.read() as s:
        record = queries.record_in(s, request_id)
        verdicts = logged_verdicts(s, [record]).get(request_id, ())
        return Hit(record, verdicts, _held_by(active_holds(s), record))
