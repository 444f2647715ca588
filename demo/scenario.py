"""The demo without an engine, and the compliance officer's steps at the end of every demo.

:func:`walkthrough` registers a key and a fingerprint, ingests one signed sample record and
reads it back bit for bit; :func:`evidence_and_audit` exports the record's evidence bundle,
verifies it offline against the pinned log key and audits the whole ledger. Each returns the
summary rows the CLI prints, and raises :class:`demo.errors.CheckFailed` when a check fails.
"""

from __future__ import annotations

import base64
import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from client.ledger_client import LedgerClient
from demo.engine import register_demo_key
from demo.errors import CheckFailed
from ledger.atomic_file import write_atomically
from ledger.clock import utc_now
from ledger.evidence import verify_bundle
from ledger.fingerprint import FINGERPRINT_KIND, fingerprint_id
from ledger.packing import unpack_float32
from ledger.records import RECORD_KIND, Choice, build_record_body
from ledger.signing import Envelope, SigningKey, sign_envelope, verify_envelope
from ledger.storage.audit import audit
from ledger.storage.database import Database

Rows = list[tuple[str, str]]
DEMO_POOL = "demo"  # the pool of the walkthrough's sample record, and of its collector key


def sample_fingerprint() -> dict[str, Any]:
    """A fingerprint body for the demo's sample record (real collectors snapshot the engine)."""
    return {
        "schema_version": 1,
        "model": {"name": "demo-sample", "source": "ledger demo (no engine attached)"},
        "engine": {"name": "none"},
    }


def sample_record(fp_id: str, rng: random.Random) -> dict[str, Any]:
    prompt = [rng.randrange(3, 512) for _ in range(24)]
    out = [rng.randrange(3, 512) for _ in range(16)]
    # logprobs with all 24 mantissa bits in use: the round trip must keep every one
    lps = [-rng.random() * 4 for _ in out]
    top_ids = [[t, *rng.sample(range(3, 512), 4)] for t in out]
    top_lps = [[lp, *sorted((lp - rng.random() * 3 for _ in range(4)), reverse=True)] for lp in lps]
    return build_record_body(
        request_id=f"demo-{datetime.now(UTC):%Y%m%dT%H%M%S}-{rng.randrange(16**6):06x}",
        fingerprint_id=fp_id,
        worker_id="demo-worker",
        pool=DEMO_POOL,
        tier=1,
        endpoint="/v1/completions",
        model="demo-sample",
        request={"model": "demo-sample", "prompt": prompt, "max_tokens": 16, "temperature": 0},
        prompt_token_ids=prompt,
        choices=[Choice(out, lps, top_ids, top_lps, finish_reason="length")],
        started_at=utc_now(),
        ttft_ns=1_250_000,
        total_ns=18_500_000,
        system_fingerprint=None,
    )


def walkthrough(client: LedgerClient, data_dir: Path) -> tuple[Rows, str]:
    """Register a key and a fingerprint, ingest a signed record, read it back; return the
    summary rows and the record's request ID."""
    rows: list[tuple[str, str]] = []
    key = register_demo_key(client, data_dir, DEMO_POOL)
    rows.append(("collector key registered", f"{key.key_id} (signs for pool {DEMO_POOL} only)"))

    fp_body = sample_fingerprint()
    fp = client.register_fingerprint(sign_envelope(FINGERPRINT_KIND, fp_body, key))
    if fp["fingerprint_id"] != fingerprint_id(fp_body):
        raise CheckFailed("the ledger computed a different fingerprint ID")
    rows.append(("fingerprint registered", f"{fp['fingerprint_id']} ({fp['status']})"))

    body = sample_record(fp["fingerprint_id"], random.Random())
    sent = sign_envelope(RECORD_KIND, body, key)
    result = client.post_records([sent])["results"][0]
    rows.append(("record ingested", f"{result['request_id']} at log index {result['log_index']}"))

    got = client.get_record(body["request_id"])
    back = Envelope.from_dict(got["envelope"])
    verify_envelope(back, key.public_key)
    rows.append(("signature verified", f"{back.key_id} over {len(back.body_bytes)} bytes"))
    sent_lp = base64.b64decode(body["choices"][0]["logprobs"])
    back_lp = base64.b64decode(back.body["choices"][0]["logprobs"])
    if sent_lp != back_lp or back.canonical != sent.canonical:
        raise CheckFailed("the record read back differs from the one sent")
    rows.append(("logprobs bit-exact", f"{len(sent_lp) // 4} float32 values, identical bytes"))
    rows.append(("first logprob", repr(unpack_float32(back.body["choices"][0]["logprobs"])[0])))
    page = client.search_records(model="demo-sample", fields="meta", limit=1000)
    rows.append(("records for demo-sample", str(page["count"])))
    return rows, body["request_id"]


def evidence_and_audit(client: LedgerClient, db: Database, data_dir: Path, request_id: str) -> Rows:
    """What a compliance officer does: export evidence, verify it offline, audit the ledger."""
    rows: list[tuple[str, str]] = []
    cp = client.sign_checkpoint()
    rows.append(("checkpoint signed", f"tree size {cp['tree_size']}, origin {cp['origin']}"))
    bundle = client.evidence(request_id)
    path = data_dir / f"evidence-{request_id}.json"
    write_atomically(path, (json.dumps(bundle, indent=2) + "\n").encode())
    pinned = SigningKey.load(data_dir / "log-key.pem").public_key
    result = verify_bundle(json.loads(path.read_text()), pinned)
    rows.append(
        (
            "evidence verified offline",
            f"{path} (leaf {result.leaf_index} of {result.tree_size}, log key pinned"
            + (
                f"; replay verdicts: {', '.join(result.replay_verdicts)})"
                if result.replay_verdicts
                else ")"
            ),
        )
    )
    report = audit(db, pinned)
    if not report.ok:
        raise CheckFailed(f"audit failed: {report.findings[0].message}")
    rows.append(
        (
            "ledger audited",
            f"{_count(report.leaves, 'leaf', 'leaves')}, "
            f"{_count(report.checkpoints, 'checkpoint', 'checkpoints')}: all checks pass",
        )
    )
    return rows


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"
