"""Cache-key index: every record is indexed under its ``ck1`` keys at ingest; lookups read it.

A completions record with a text prompt gets two keys (the text, and the token IDs the engine
saw), so a client may look it up either way.

The index only finds candidates; what is served is re-derived from the log. A lookup reads the
envelope each candidate row points to (and its stored disclosures), recomputes that record's
keys from its own request, endpoint and fingerprint (``keys_of_record``, exactly as ingest
computed them) and raises ``IndexMismatch`` unless the key asked for is one of them (and the
row's request ID is the envelope's): a mismatched row is an error, never an answer. Whether a
record is reusable is decided from the envelope, not the index columns: tier >= 1, deterministic
sampling (temperature 0, or a seed other than -1) and not ``aborted``. Of several reusable
records under one key the earliest in log order (lowest log index) is the answer. The 404
``cache_miss`` says why when records exist but none qualifies. An erasure deletes a record's
keys with its content (a key is derived from the prompt), so erased content is a miss, never an
answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.audit.derive import chat_template
from ledger.cachekey import (
    CHAT,
    PREFIX,
    cache_key,
    is_deterministic,
    keys_of_record,
    samples_at_random,
)
from ledger.errors import InvalidInput, NotFound
from ledger.inference_record import InferenceRecord
from ledger.storage.bulk import insert_rows
from ledger.storage.database import Database
from ledger.storage.models import CacheKey, LogEntry, Record
from ledger.storage.queries import (
    FINGERPRINT_ID,
    StoredRecord,
    from_log,
    logged_fingerprints,
    mismatch,
    with_content,
)

_KEY_HEX = frozenset("0123456789abcdef")
# Candidate envelopes read per query while looking for the earliest reusable record, and how
# many of the records the index marks as not reusable a miss reads to say why.
CHUNK = 16


def chat_template_digest(fingerprint_body: dict[str, Any]) -> str | None:
    """The digest chat keys are made under: what the audit recomputes them with (None when
    the body names none, whatever shape its ``model`` or ``chat_template`` has)."""
    return chat_template(fingerprint_body)


def fingerprint_body(session: Session, fingerprint_id: str) -> dict[str, Any]:
    """The body of a registered fingerprint, from its log entry; IndexMismatch unless that
    entry's body really has this ID."""
    if not FINGERPRINT_ID.fullmatch(fingerprint_id):
        raise InvalidInput(
            "fingerprint_id must be sha256: and 64 lowercase hex digits",
            code="invalid_parameters",
        )
    row = logged_fingerprints(session, [fingerprint_id]).get(fingerprint_id)
    if row is None:
        raise NotFound(f"no fingerprint {fingerprint_id}", code="fingerprint_not_found")
    body: dict[str, Any] = row.envelope["body"]
    return body


@dataclass(frozen=True)
class Keyed:
    """A record's cache keys and what a lookup filters on, computed before the append lock."""

    request_id: str
    keys: list[str]
    tier: int
    deterministic: bool


def prepare(
    records: Sequence[InferenceRecord], templates: dict[str, str | None]
) -> dict[str, Keyed]:
    """Compute the keys of validated records with all their content (outside the write
    transaction: the append lock then only covers the inserts). ``templates``: the chat
    template digest of each registered fingerprint the chat records name
    (``registered.chat_templates``); one not there is refused by the ingest, under the lock."""
    return {
        record.request_id: Keyed(
            record.request_id,
            keys_of_record(
                record, templates.get(record.fingerprint_id) if record.endpoint == CHAT else None
            ),
            record.tier,
            is_deterministic(record.sampling),
        )
        for record in records
    }


def index_records(session: Session, items: Sequence[tuple[Keyed, int]]) -> None:
    """Index newly appended records (prepared keys, log index), in the ingest transaction."""
    rows = [
        (key, keyed.request_id, idx, keyed.tier, keyed.deterministic)
        for keyed, idx in items
        for key in keyed.keys
    ]
    insert_rows(
        session, CacheKey, ("cache_key", "request_id", "log_index", "tier", "deterministic"), rows
    )


@dataclass(frozen=True)
class CacheHit:
    key: str
    record: StoredRecord


def check_key(key: str) -> None:
    if not (
        key.startswith(PREFIX)
        and len(key) == len(PREFIX) + 64
        and set(key[len(PREFIX) :]) <= _KEY_HEX
    ):
        raise InvalidInput(
            f"a cache key is {PREFIX} and 64 lowercase hex digits", code="invalid_parameters"
        )


OTHER_POOL = "recorded in another pool"


def unusable(record: StoredRecord, pool: str | None = None) -> str | None:
    """Why a record, as logged, is no cache answer (None: it is one); with ``pool``, a record
    that pool's collectors did not sign is none either (a lookup by pool trusts only them)."""
    if pool is not None and record.pool != pool:
        return OTHER_POOL
    if record.aborted:
        return "aborted"
    if record.tier < 1:
        return "tier 0"
    sampling = record.record.sampling
    if not is_deterministic(sampling) or samples_at_random(sampling):  # as indexed; as vLLM ran it
        return "non-deterministic sampling"
    return None


def logged_candidate(key: str, row: Any, entry: Any) -> StoredRecord:
    """The record the log entry (``idx``, ``envelope``, ``appended_at``; None: there is none)
    that a cache-key row points to holds; IndexMismatch unless it is the row's record."""
    what = f"cache key {key} of {row.request_id!r}"
    if entry is None:
        raise mismatch(what, row.log_index, "no such log entry")
    stored = from_log(entry.idx, entry.envelope, entry.appended_at)
    if stored.request_id != row.request_id:
        raise mismatch(what, row.log_index, f"the entry is the record of {stored.request_id!r}")
    return stored


def checked_candidate(
    key: str, row: Any, stored: StoredRecord, chat_template: Callable[[str], str | None]
) -> StoredRecord:
    """``stored`` (its content read) when it is what the row says: its content agrees with the
    erasure index and is not erased, its own request has ``key`` among its keys (a chat
    record's under ``chat_template(fingerprint_id)``), and the row's tier and determinism are
    the record's; IndexMismatch otherwise."""
    what = f"cache key {key} of {row.request_id!r}"
    stored.check_content()
    record = stored.record
    if stored.erased or not record.complete:  # an erasure deletes the keys with the content
        raise mismatch(what, row.log_index, "the record's content was erased")
    template = chat_template(record.fingerprint_id) if record.endpoint == CHAT else None
    if key not in keys_of_record(record, template):
        raise mismatch(what, row.log_index, "the record's request has other keys")
    if row.tier != record.tier or bool(row.deterministic) != is_deterministic(record.sampling):
        raise mismatch(what, row.log_index, "its tier or determinism differs from the record")
    return stored


class _Verifier:
    """Re-derives from the log the records that cache-key rows point to (one transaction)."""

    def __init__(self, session: Session, key: str) -> None:
        self.session = session
        self.key = key
        self.templates: dict[str, str | None] = {}

    def records(self, rows: Sequence[Any]) -> list[StoredRecord]:
        """The records ``rows`` point to, in the rows' order, each checked against its row."""
        if not rows:
            return []
        entries = {
            e.idx: e
            for e in self.session.execute(
                select(LogEntry.idx, LogEntry.envelope, LogEntry.appended_at).where(
                    LogEntry.idx.in_([r.log_index for r in rows])
                )
            )
        }
        logged = {
            row.log_index: logged_candidate(self.key, row, entries.get(row.log_index))
            for row in rows
        }
        with_it = {s.log_index: s for s in with_content(self.session, list(logged.values()))}
        return [
            checked_candidate(self.key, row, with_it[row.log_index], self._template) for row in rows
        ]

    def _template(self, fingerprint_id: str) -> str | None:
        if fingerprint_id not in self.templates:
            body = fingerprint_body(self.session, fingerprint_id)
            self.templates[fingerprint_id] = chat_template_digest(body)
        return self.templates[fingerprint_id]


@dataclass(frozen=True)
class Found:
    """What the rows under one key hold: the earliest reusable record (None: none), the marked
    rows read up to it, how many rows the key has, and why the others are not answers."""

    hit: StoredRecord | None
    marked: tuple[tuple[int, str], ...]
    rows: int
    reasons: frozenset[str]


def is_marked(row: Any) -> bool:
    """Whether a row's columns mark its record reusable (what the envelope then decides)."""
    return bool(row.tier >= 1 and row.deterministic)


def find_reusable(session: Session, key: str, pool: str | None = None) -> Found:
    """The earliest reusable record under ``key``, re-derived from the log (module docstring);
    with ``pool``, the earliest one recorded in that pool.

    Every row read is checked against the envelope it points to, its ``tier`` and
    ``deterministic`` columns included; the rows those columns mark reusable are read first,
    in log order, 16 envelopes per query, until one is reusable as logged (it is not when it
    was ``aborted``). A miss reads up to 16 of the other rows to say why they do not qualify.
    IndexMismatch: the index disagrees with the log (never an answer)."""
    query = select(
        CacheKey.request_id, CacheKey.log_index, CacheKey.tier, CacheKey.deterministic
    ).where(CacheKey.cache_key == key)
    if pool is not None:
        # The records index narrows what is read, so other pools' rows cost nothing; an
        # edited records.pool can only hide a record (the audit names the column), since
        # the envelope's own pool decides (unusable).
        query = query.join(Record, Record.log_index == CacheKey.log_index).where(
            Record.pool == pool
        )
    rows = session.execute(query.order_by(CacheKey.log_index, CacheKey.request_id)).all()
    verifier = _Verifier(session, key)
    marked = [r for r in rows if is_marked(r)]
    reasons: set[str] = set()
    for start in range(0, len(marked), CHUNK):
        chunk = marked[start : start + CHUNK]
        for i, record in enumerate(verifier.records(chunk)):
            why = unusable(record, pool)
            if why is None:
                seen = tuple((r.log_index, r.request_id) for r in marked[: start + i + 1])
                return Found(record, seen, len(rows), frozenset(reasons))
            reasons.add(why)
    others = [r for r in rows if not is_marked(r)]
    reasons.update(str(unusable(r, pool)) for r in verifier.records(others[:CHUNK]))
    return Found(None, (), len(rows), frozenset(reasons))


def miss_message(found: Found) -> str:
    return (
        f"{found.rows} record(s) have this key, none reusable ({', '.join(sorted(found.reasons))})"
        ": a cache answer needs tier >= 1, temperature 0 or a seed other than -1, and a record "
        "that was not aborted (and, looked up by pool, one recorded in that pool)"
    )


def lookup(db: Database, key: str) -> CacheHit:
    """The earliest reusable record under ``key``, re-derived from the log (:func:`find_reusable`).
    NotFound: no answer; IndexMismatch: the index disagrees with the log (never an answer)."""
    check_key(key)
    with db.read() as s:
        found = find_reusable(s, key)
    if found.hit is not None:
        return CacheHit(key, found.hit)
    if found.rows:
        raise NotFound(miss_message(found), code="cache_miss", details={"records": found.rows})
    raise NotFound("no record has this cache key", code="cache_miss")


def key_for_request(
    db: Database,
    endpoint: str,
    request: dict[str, Any],
    fingerprint_id: str,
    prompt_token_ids: list[int] | None = None,
) -> str:
    """The key of a request under a registered fingerprint (its chat template digest read)."""
    with db.read() as s:
        body = fingerprint_body(s, fingerprint_id)
    return cache_key(
        endpoint,
        request,
        fingerprint_id,
        prompt_token_ids=prompt_token_ids,
        chat_template=chat_template_digest(body),
    )
