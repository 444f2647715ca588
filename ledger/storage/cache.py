"""Cache-key index: every record is indexed under its ``ck1`` keys at ingest; lookups read it.

A completions record with a text prompt gets two keys (the text, and the token IDs the engine
saw), so a client may look it up either way. A lookup answers only records at tier >= 1 with
deterministic sampling; the 404 says why when a record exists but does not qualify.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.cachekey import CHAT, cache_key, is_deterministic, record_keys
from ledger.errors import InvalidInput, NotFound
from ledger.packing import unpack_int32
from ledger.signing import Envelope
from ledger.storage import log
from ledger.storage.bulk import insert_rows
from ledger.storage.database import Database
from ledger.storage.models import CacheKey, Fingerprint
from ledger.storage.queries import StoredRecord, record_in


def chat_template_digest(fingerprint_body: dict[str, Any]) -> str | None:
    template = (fingerprint_body.get("model") or {}).get("chat_template") or {}
    digest = template.get("digest")
    return digest if isinstance(digest, str) else None


def fingerprint_body(session: Session, fingerprint_id: str) -> dict[str, Any]:
    row = session.get(Fingerprint, fingerprint_id)
    if row is None:
        raise NotFound(f"no fingerprint {fingerprint_id}", code="fingerprint_not_found")
    data = log.read_envelope(session, row.log_index)
    assert data is not None
    body: dict[str, Any] = json.loads(data)["body"]
    return body


def keys_for(body: dict[str, Any], chat_template: str | None) -> list[str]:
    """The cache keys of a validated record body (none when its request cannot be keyed)."""
    endpoint = body["endpoint"]
    try:
        ids = unpack_int32(body["prompt_token_ids"]) if endpoint != CHAT else None
        return record_keys(
            endpoint,
            body["request"],
            body["fingerprint_id"],
            prompt_token_ids=ids,
            chat_template=chat_template,
        )
    except InvalidInput:
        return []


@dataclass(frozen=True)
class Keyed:
    """A record's cache keys and what a lookup filters on, computed before the append lock."""

    request_id: str
    keys: list[str]
    tier: int
    deterministic: bool


def prepare(session: Session, envelopes: Sequence[Envelope]) -> dict[str, Keyed]:
    """Compute the keys of validated record envelopes (outside the write transaction: the
    append lock then only covers the inserts). Reads the chat templates it needs."""
    templates: dict[str, str | None] = {}
    out: dict[str, Keyed] = {}
    for env in envelopes:
        body = env.body
        fp = body["fingerprint_id"]
        if body["endpoint"] == CHAT and fp not in templates:
            try:
                templates[fp] = chat_template_digest(fingerprint_body(session, fp))
            except NotFound:  # the ingest refuses the batch for it, under the lock
                templates[fp] = None
        out[body["request_id"]] = Keyed(
            body["request_id"],
            keys_for(body, templates.get(fp)),
            body["tier"],
            is_deterministic(body["request"]),
        )
    return out


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


def lookup(db: Database, key: str) -> CacheHit:
    """The earliest qualifying record under ``key``; NotFound says why there is none."""
    with db.read() as s:
        rows = (
            s.execute(
                select(CacheKey).where(CacheKey.cache_key == key).order_by(CacheKey.log_index)
            )
            .scalars()
            .all()
        )
        for row in rows:
            if row.tier >= 1 and row.deterministic:
                return CacheHit(key, record_in(s, row.request_id))
    if rows:
        reasons = sorted({"tier 0" if r.tier < 1 else "non-deterministic sampling" for r in rows})
        raise NotFound(
            f"{len(rows)} record(s) have this key, none reusable ({', '.join(reasons)}): a cache "
            "answer needs tier >= 1 and temperature 0 or a seed",
            code="cache_miss",
            details={"records": len(rows)},
        )
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
