"""Signed sample documents for tests."""

from __future__ import annotations

import random
import uuid
from typing import Any

from ledger import disclosures
from ledger.canonical import digest_of
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.record_v2 import commit_record, content_members
from ledger.records import RECORD_KIND, Choice, build_record_body
from ledger.signing import Envelope, SigningKey, sign_envelope
from ledger.storage.ingest import RecordItem


def fingerprint_body(name: str | None = None) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "model": {"name": name or f"model-{uuid.uuid4().hex[:8]}"},
        "engine": {"name": "test"},
    }


def fingerprint_envelope(key: SigningKey, name: str | None = None) -> Envelope:
    return sign_envelope(FINGERPRINT_KIND, fingerprint_body(name), key)


def record_body(
    fingerprint_id: str,
    *,
    request_id: str | None = None,
    model: str = "test-model",
    tier: int = 1,
    pool: str = "p1",
    prompt_len: int = 12,
    out_len: int = 8,
    top_k: int = 0,
    seed: int | None = None,
    text_prompt: bool = False,
    request_extra: dict[str, Any] | None = None,
    logprob: float | None = None,  # the first output token's, as signed
) -> dict[str, Any]:
    rng = random.Random(seed)
    prompt = [rng.randrange(0, 50_000) for _ in range(prompt_len)]
    out = [rng.randrange(0, 50_000) for _ in range(out_len)]
    lps = [-rng.random() * 5 for _ in out]
    if logprob is not None:
        lps[0] = logprob
    top_ids = [[rng.randrange(0, 50_000) for _ in range(top_k)] for _ in out] if top_k else None
    top_lps = [[-rng.random() * 9 for _ in range(top_k)] for _ in out] if top_k else None
    return build_record_body(
        request_id=request_id or f"req-{uuid.uuid4().hex}",
        fingerprint_id=fingerprint_id,
        worker_id="w1",
        pool=pool,
        tier=tier,
        endpoint="/v1/completions",
        model=model,
        request={
            "model": model,
            "prompt": " ".join(f"w{t}" for t in prompt) if text_prompt else prompt,
            "max_tokens": out_len,
            "temperature": 0.7,
            **(request_extra or {}),
        },
        prompt_token_ids=prompt,
        choices=[Choice(out, lps, top_ids, top_lps, finish_reason="length")],
        started_at="2026-11-29T09:00:00.123456Z",
        ttft_ns=1_000_000,
        total_ns=9_000_000,
        system_fingerprint="vllm-0.32.0-deadbeef",
    )


def record_envelope(key: SigningKey, fingerprint_id: str, **kw: Any) -> Envelope:
    return sign_envelope(RECORD_KIND, record_body(fingerprint_id, **kw), key)


def record_v2(key: SigningKey, fingerprint_id: str, **kw: Any) -> tuple[Envelope, list[str]]:
    """A signed schema v2 record and its disclosures (fresh salts)."""
    body, disclosures = commit_record(record_body(fingerprint_id, **kw))
    return sign_envelope(RECORD_KIND, body, key), disclosures


def record_item_v2(key: SigningKey, fingerprint_id: str, **kw: Any) -> RecordItem:
    env, disclosures = record_v2(key, fingerprint_id, **kw)
    return RecordItem(env.to_dict(), disclosures)


def salt_in(disclosure: str) -> str:
    return disclosures.parse(disclosure).salt


def record_item_salted(seeded: Any, salt: str, **kw: Any) -> RecordItem:
    """A v2 record of ``seeded``'s collector and fingerprint whose first disclosure takes
    ``salt`` (another record's, say: :func:`salt_in`), the others fresh salts."""
    v1 = record_body(seeded.fingerprint_id, **kw)
    body, _ = commit_record(v1)
    made = [
        disclosures.make(m, v, salt if i == 0 else None)
        for i, (m, v) in enumerate(content_members(v1).items())
    ]
    body["disclosure_digests"] = sorted(d.digest for d in made)
    envelope = sign_envelope(RECORD_KIND, body, seeded.collector).to_dict()
    return RecordItem(envelope, [d.encoded for d in made])


def resign(key: SigningKey, body: dict[str, Any], kind: str = RECORD_KIND) -> dict[str, Any]:
    """Sign a (possibly invalid) body and return the envelope as a plain dict."""
    return sign_envelope(kind, body, key).to_dict()


def verdict_body(
    record: dict[str, Any], log_index: int, verdict: str, **extra: Any
) -> dict[str, Any]:
    """A replay verdict's body about ``record`` (a record body, as logged at ``log_index``), as
    the replayer writes one; sign and log it with ``verdicts.append_verdict``."""
    return {
        "schema_version": 1,
        "replay_id": f"rep-{uuid.uuid4().hex[:12]}",
        "request_id": record["request_id"],
        "record": {
            "log_index": log_index,
            "content_hash": digest_of(record),
            "fingerprint_id": record["fingerprint_id"],
        },
        "pool": record["pool"],
        "worker_id": "w-replay",
        "verdict": verdict,
        "reason": None,
        **extra,
    }
