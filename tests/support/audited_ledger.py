"""A small ledger with a row in every ledger table, for the audit's tamper tests.

Leaves, in order: the log key's registration (0), a collector's (1), a fingerprint (2), a chat
fingerprint with a chat template (3), records of every cache-key shape (completions with a
text prompt: two keys; with token IDs; greedy and seeded; chat: one key under the template;
tiers 0-2), a second collector key, registered and revoked, a replay verdict and a pool
certificate; a checkpoint (with its signed time) after each stage.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from ledger.fingerprint import FINGERPRINT_KIND
from ledger.records import RECORD_KIND, Choice, build_record_body
from ledger.signing import SigningKey, public_key_pem, sign_envelope
from ledger.storage import checkpoints, ingest, keystore, verdicts
from ledger.storage.database import Database
from ledger.storage.models import KeyRevocation
from tests.support.documents import record_envelope
from tests.support.seed import seed_ledger

ORIGIN = "test.example/audit"
TEMPLATE = "sha256:" + hashlib.sha256(b"{{ messages }}").hexdigest()


@dataclass
class Built:
    log_key: SigningKey
    collector: SigningKey
    fingerprint_id: str
    chat_fingerprint_id: str
    records: dict[str, int] = field(default_factory=dict)  # request ID -> leaf
    replay_id: str = "rpl-audit-1"
    certificate_id: str = "cert-audit-1"
    replay_leaf: int = -1
    certificate_leaf: int = -1
    revoked_key_id: str = ""
    revocation_leaf: int = -1


def chat_body(fingerprint_id: str, request_id: str, *, temperature: float = 0.0) -> dict[str, Any]:
    return build_record_body(
        request_id=request_id,
        fingerprint_id=fingerprint_id,
        worker_id="w1",
        pool="p1",
        tier=2,
        endpoint="/v1/chat/completions",
        model="chat-model",
        request={
            "model": "chat-model",
            "messages": [{"role": "user", "content": f"hello {request_id}"}],
            "temperature": temperature,
        },
        prompt_token_ids=[1, 2, 3, 4],
        choices=[Choice([5, 6, 7], [-0.5, -0.25, -0.125], finish_reason="stop")],
        started_at="2026-11-29T09:00:00.123456Z",
        ttft_ns=1_000_000,
        total_ns=9_000_000,
        system_fingerprint="vllm-0.32.0-deadbeef",
    )


def build(db: Database) -> Built:
    seeded = seed_ledger(db)
    log_key, collector, fp = seeded.log_key, seeded.collector, seeded.fingerprint_id
    chat_fp_body = {
        "schema_version": 1,
        "model": {"name": "chat-model", "chat_template": {"digest": TEMPLATE}},
        "engine": {"name": "test"},
    }
    chat_fp = ingest.add_fingerprint(
        db, sign_envelope(FINGERPRINT_KIND, chat_fp_body, collector).to_dict()
    ).fingerprint_id
    built = Built(log_key, collector, fp, chat_fp)
    checkpoints.sign_if_new(db, log_key, ORIGIN)
    envelopes = [
        record_envelope(collector, fp, request_id="req-text", text_prompt=True, tier=1),
        record_envelope(
            collector, fp, request_id="req-greedy", tier=2, request_extra={"temperature": 0}
        ),
        record_envelope(collector, fp, request_id="req-seeded", tier=0, request_extra={"seed": 7}),
        sign_envelope(RECORD_KIND, chat_body(chat_fp, "req-chat"), collector),
        record_envelope(collector, fp, request_id="req-plain", pool="p2", model="other-model"),
    ]
    for result in ingest.ingest_records(db, [e.to_dict() for e in envelopes]):
        built.records[result.request_id] = result.log_index
    checkpoints.sign_if_new(db, log_key, ORIGIN)
    second = SigningKey.generate()
    info, _ = keystore.register_key(
        db, log_key, name="c2", role="collector", public_key=public_key_pem(second.public_key)
    )
    later = ingest.ingest_records(db, [record_envelope(second, fp, request_id="req-c2").to_dict()])
    built.records["req-c2"] = later[0].log_index
    revoked, _ = keystore.revoke_key(db, log_key, info.key_id, "rotated")
    built.revoked_key_id = info.key_id
    with db.read() as s:
        row = s.get(KeyRevocation, info.key_id)
        assert row is not None and revoked.revoked
        built.revocation_leaf = row.log_index
    stored = verdicts.append_verdict(
        db,
        log_key,
        {
            "replay_id": built.replay_id,
            "request_id": "req-greedy",
            "verdict": "bitwise",
            "pool": "p1",
            "worker_id": "w1",
            "reason": None,
        },
    )
    built.replay_leaf = stored.log_index
    cert = verdicts.append_certificate(
        db,
        log_key,
        {
            "certificate_id": built.certificate_id,
            "pool": "p1",
            "fingerprint_id": fp,
            "invariant_observed": True,
        },
    )
    built.certificate_leaf = cert.log_index
    checkpoints.sign_if_new(db, log_key, ORIGIN)
    return built
