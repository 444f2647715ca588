"""The index rows a leaf implies: what ingest wrote for it, recomputed from its envelope.

One function per table, each the same derivation the write path uses
(``ledger/storage/ingest.py``, ``cache.py``, ``verdicts.py``; tests hold them equal): a row's
log index is the leaf's, its time the leaf's receive time, every other column a member of
the signed body (or the envelope's signer and content digest). A body that lacks a member the
row needs raises ``KeyError``/``TypeError``; the caller reports the leaf.
"""

from __future__ import annotations

import json
from typing import Any

from ledger.audit.rows import (
    CacheKeyRow,
    CertificateRow,
    ErasureRow,
    FingerprintRow,
    HoldReleaseRow,
    HoldRow,
    Micros,
    RecordRow,
    ReplayRow,
)
from ledger.cachekey import is_deterministic, keys_of_record
from ledger.erasure import ERASURE_KIND, HOLD_KIND, RELEASE_KIND
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.inference_record import InferenceRecord
from ledger.records import RECORD_KIND
from ledger.replay import VERDICT_KIND
from ledger.signing import Envelope

CERTIFICATE_KIND = "pool_certificate"  # ledger.storage.verdicts' (a test holds them equal)
INDEXED_KINDS = (
    RECORD_KIND,
    FINGERPRINT_KIND,
    VERDICT_KIND,
    CERTIFICATE_KIND,
    ERASURE_KIND,
    HOLD_KIND,
    RELEASE_KIND,
)


def chat_template(fingerprint_body: dict[str, Any]) -> str | None:
    """The chat template digest a fingerprint names (what chat cache keys are made under)."""
    model = fingerprint_body.get("model")
    template = (model if isinstance(model, dict) else {}).get("chat_template") or {}
    digest = template.get("digest") if isinstance(template, dict) else None
    return digest if isinstance(digest, str) else None


def _str(body: dict[str, Any], member: str) -> str:
    value = body[member]
    if not isinstance(value, str):
        raise TypeError(f"{member} is not a string")
    return value


def record_row(env: Envelope, idx: int, at: Micros | None) -> RecordRow:
    body = env.body
    tier = body["tier"]
    if not isinstance(tier, int) or isinstance(tier, bool):
        raise TypeError("tier is not an integer")
    return RecordRow(
        request_id=_str(body, "request_id"),
        log_index=idx,
        content_hash=env.body_digest,
        fingerprint_id=_str(body, "fingerprint_id"),
        key_id=env.key_id,
        model=_str(body, "model"),
        tier=tier,
        pool=_str(body, "pool"),
        worker_id=_str(body, "worker_id"),
        endpoint=_str(body, "endpoint"),
        received_at=at,
    )


def cache_key_rows(record: InferenceRecord, idx: int, template: str | None) -> list[CacheKeyRow]:
    """The ``cache_keys`` rows of a record leaf, from its parsed body (with a v2 record's
    stored disclosures that open): its ``ck1`` keys (none when its request cannot be keyed or
    its content was erased), each with the record's tier and whether its sampling is
    deterministic."""
    keys = keys_of_record(record, template)
    deterministic = is_deterministic(record.sampling)
    return [CacheKeyRow(key, record.request_id, idx, record.tier, deterministic) for key in keys]


def erasure_row(env: Envelope, idx: int, at: Micros | None) -> ErasureRow:
    body = env.body
    return ErasureRow(_str(body, "request_id"), idx, _str(body, "reason_code"), at)


def hold_row(env: Envelope, idx: int, at: Micros | None) -> HoldRow:
    """As ``ledger.storage.erasures.place_hold`` writes it (filter: sorted-key JSON)."""
    body = env.body
    flt = body.get("filter")
    return HoldRow(
        _str(body, "hold_id"),
        idx,
        body.get("request_id"),
        json.dumps(flt, sort_keys=True) if flt else None,
        at,
    )


def release_row(env: Envelope, idx: int, at: Micros | None) -> HoldReleaseRow:
    return HoldReleaseRow(_str(env.body, "hold_id"), idx, at)


def fingerprint_row(env: Envelope, idx: int, at: Micros | None) -> FingerprintRow:
    # The fingerprint ID is the digest of the canonical body: the envelope's body digest.
    return FingerprintRow(env.body_digest, env.key_id, idx, at)


def _member(body: dict[str, Any], name: str) -> Any:
    """A member as the body holds it (None when absent): compared with the row, whatever it is."""
    return body.get(name)


def replay_row(env: Envelope, idx: int, at: Micros | None) -> ReplayRow:
    body = env.body
    return ReplayRow(
        replay_id=_member(body, "replay_id"),
        request_id=_member(body, "request_id"),
        log_index=idx,
        verdict=_member(body, "verdict"),
        pool=_member(body, "pool"),
        worker_id=_member(body, "worker_id"),
        created_at=at,
    )


def certificate_row(env: Envelope, idx: int, at: Micros | None) -> CertificateRow:
    body = env.body
    return CertificateRow(
        certificate_id=_member(body, "certificate_id"),
        pool=_member(body, "pool"),
        fingerprint_id=_member(body, "fingerprint_id"),
        log_index=idx,
        invariant=_member(body, "invariant_observed"),
        created_at=at,
    )
