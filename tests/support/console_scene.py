"""A ledger with something on every console page: chat and completion records under a rich
fingerprint (H200s, vLLM, serial invariance), replay verdicts (one bitwise, one diverged with
its first divergence and margin), an erased record, a held one, an aborted one, a second
fingerprint to compare, a live worker and a pool certificate. Used by the browser tests, the
screenshot script (``docs/ui/screenshots.py``) and ``bench/ui.py``."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from typing import Any

from ledger.certify import certificate
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.record_v2 import commit_record
from ledger.records import RECORD_KIND, Choice, build_record_body
from ledger.signing import SigningKey, sign_envelope
from ledger.storage import verdicts
from tests.support.documents import verdict_body
from tests.support.harness import Harness
from tests.support.workers import heartbeat, post_heartbeat

FINGERPRINT = {
    "schema_version": 1,
    "model": {
        "name": "Qwen/Qwen3-8B",
        "digest": "sha256:" + "ab" * 32,
        "tokenizer_digest": "sha256:" + "cd" * 32,
        "chat_template_digest": "sha256:" + "ef" * 32,
    },
    "engine": {
        "name": "vllm",
        "version": "0.32.0",
        "batch_invariance": "serial",
        "max_num_seqs": 1,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": False,
    },
    "runtime": {"torch": "2.13.0", "cuda": "13.0", "cublas": "13.1.0.3", "nccl": "2.28.7"},
    "gpu": {
        "driver_version": "580.65.06",
        "gpus": [{"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771}],
    },
}
PROMPTS = [
    "Summarise the attached incident report in three sentences.",
    "Which clauses of the supplier contract mention data retention?",
    "Translate 'the model output must be reproducible' into German.",
    "List the steps to rotate the ledger's log key.",
    "Draft a reply declining the meeting on Thursday.",
]


@dataclass
class ConsoleScene:
    h: Harness
    fingerprint_id: str
    other_fingerprint_id: str
    ids: dict[str, str] = field(default_factory=dict)  # role -> request ID


def _register(h: Harness, key: SigningKey, body: dict[str, Any]) -> str:
    env = sign_envelope(FINGERPRINT_KIND, body, key)
    resp = h.client().post("/v1/fingerprints", content=env.canonical)
    assert resp.status_code == 201, resp.text
    fp: str = resp.json()["fingerprint_id"]
    return fp


def _body(fp: str, i: int, *, pool: str = "strict", aborted: bool | None = None) -> dict[str, Any]:
    rng = random.Random(i)
    n = 24
    out = [rng.randrange(100, 50_000) for _ in range(n)]
    lps = [-(rng.random() ** 3) * (4 if k % 7 == 3 else 0.6) for k in range(n)]
    top_ids = [[t, *(rng.randrange(100, 50_000) for _ in range(2))] for t in out]
    top_lps = [[lp, lp - 0.2 - rng.random(), lp - 1.5 - rng.random()] for lp in lps]
    chat = i % 2 == 0
    prompt = PROMPTS[i % len(PROMPTS)]
    request: dict[str, Any] = {
        "model": "Qwen/Qwen3-8B",
        "temperature": 0,
        "seed": 7,
        "max_tokens": n,
        "logprobs": 3 if not chat else True,
    }
    if chat:
        request["messages"] = [{"role": "user", "content": prompt}]
        request["top_logprobs"] = 3
    else:
        request["prompt"] = prompt
    return build_record_body(
        request_id=f"req-{uuid.uuid4().hex[:16]}",
        fingerprint_id=fp,
        worker_id="gpu-0",
        pool=pool,
        tier=2,
        endpoint="/v1/chat/completions" if chat else "/v1/completions",
        model="Qwen/Qwen3-8B",
        request=request,
        prompt_token_ids=[rng.randrange(100, 50_000) for _ in range(12)],
        choices=[
            Choice(
                out,
                lps,
                top_ids,
                top_lps,
                finish_reason="length",
                text=" ".join(f"w{t % 997}" for t in out),
            )
        ],
        started_at="2026-12-01T09:00:00.123456Z",
        ttft_ns=18_000_000,
        total_ns=240_000_000,
        system_fingerprint="vllm-0.32.0",
        aborted=aborted,
    )


def _post(h: Harness, key: SigningKey, body: dict[str, Any]) -> tuple[str, int]:
    committed, disclosures = commit_record(body)
    env = sign_envelope(RECORD_KIND, committed, key)
    resp = h.client().post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert resp.status_code == 201, resp.text
    return env.body["request_id"], int(resp.json()["results"][0]["log_index"])


def _verdict(h: Harness, body: dict[str, Any], index: int, verdict: str, at: int | None) -> None:
    record = h.client().get(f"/v1/records/{body['request_id']}").json()["envelope"]["body"]
    comparison = None
    if at is not None:
        comparison = {
            "verdict": verdict,
            "prompt_equal": True,
            "first_divergence": {"choice": 0, "position": at},
            "choices": [
                {
                    "index": 0,
                    "first_divergence": at,
                    "top2_margin_at_divergence": 0.0312,
                    "tokens_equal": False,
                }
            ],
        }
    extra = {
        "pool": "strict",
        "worker_id": "gpu-0",
        "reason": None if at is None else "an output token differs",
        "replayed_at": "2026-12-01T10:15:00.000000Z",
    }
    if comparison:
        extra["comparison"] = comparison
    verdicts.append_verdict(h.db, h.log_key, verdict_body(record, index, verdict, **extra))


def build_scene(h: Harness, records: int = 8) -> ConsoleScene:
    key = h.collector()
    fp = _register(h, key, FINGERPRINT)
    upgraded = {**FINGERPRINT, "runtime": {**FINGERPRINT["runtime"], "cublas": "13.2.0.1"}}
    other = _register(h, key, upgraded)
    scene = ConsoleScene(h, fp, other)
    bodies = {}
    for i in range(records):
        aborted = True if i == 3 else None
        body = _body(fp, i, aborted=aborted)
        rid, index = _post(h, key, body)
        bodies[rid] = (body, index)
        role = {0: "bitwise", 1: "diverged", 2: "erased", 3: "aborted", 4: "held"}.get(i)
        if role:
            scene.ids[role] = rid
    scene.ids.setdefault("plain", rid)
    _verdict(h, *bodies[scene.ids["bitwise"]], "bitwise", None)
    _verdict(h, *bodies[scene.ids["diverged"]], "diverged", 11)
    c = h.client()
    resp = c.post(f"/v1/records/{scene.ids['erased']}/erasure", json={"reason": "GDPR Art. 17"})
    assert resp.status_code == 201, resp.text
    resp = c.post("/v1/holds", json={"request_id": scene.ids["held"], "reason": "case 2026-118"})
    assert resp.status_code == 201, resp.text
    beat = heartbeat(
        key, worker_id="gpu-0", pool="strict", url="http://127.0.0.1:9/", fingerprint_id=fp
    )
    assert post_heartbeat(h, beat).status_code in (200, 201)
    cells = [
        {
            "max_tokens": n,
            "concurrency": conc,
            "requests": 16,
            "exact_tokens": 16,
            "bitwise": 16 if conc < 16 or n < 256 else 14,
            "exact_token_rate": 1.0,
            "bitwise_rate": 1.0 if conc < 16 or n < 256 else 14 / 16,
            "first_divergences": [],
            "min_margin": 0.01,
            "min_margin_at_divergence": None if conc < 16 or n < 256 else 0.004,
        }
        for conc in (1, 4, 16)
        for n in (16, 64, 256)
    ]
    verdicts.append_certificate(
        h.db,
        h.log_key,
        certificate(
            certificate_id=f"cert-{uuid.uuid4().hex[:12]}",
            pool="strict",
            worker_id="gpu-0",
            fingerprint_id=fp,
            batch_invariance="serial",
            parameters={"prompts": 16, "concurrency": [1, 4, 16], "max_tokens": [16, 64, 256]},
            results=cells,
        ),
    )
    assert c.post("/v1/log/checkpoint").status_code == 200
    return scene
