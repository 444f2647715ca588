"""What the demo does with its two pools: traffic, replays, a cache lookup, certification.

Every step goes through the same public interfaces a user has: OpenAI requests to the
collectors, and the ledger API (``LedgerClient``) for replays, cache keys and certification.
Each step returns summary rows; a result that contradicts what the pools are (a strict record
that does not replay bitwise, a default pool certified invariant) stops the demo with an error.
"""

from __future__ import annotations

import base64
import logging
import struct
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from client.ledger_client import LedgerClient
from demo.engine import Worker
from demo.errors import CheckFailed, DemoTrouble
from ledger.cachekey import is_deterministic
from ledger.errors import Conflict, NotFound
from ledger.inference_record import body_view
from ledger.signing import Envelope, SigningKey, verify_envelope

log = logging.getLogger("ledger.demo")

Rows = list[tuple[str, str]]
PROMPTS = [
    "The ledger keeps a record of",
    "Replay this request and check the bits",
    "Once upon a time, on two CPU cores,",
    "Batch composition moves the reduction order, so",
    "A fingerprint names the model, the libraries and",
    "Compliance officers want proof that",
    "Seven",
    "What changed between these two environments?",
]


def mixed_request(pool: str, i: int) -> tuple[str, dict[str, Any], int]:
    """(endpoint, body, tier): chat and completions, streamed or not, tiers 0-2, mixed."""
    prompt = PROMPTS[i % len(PROMPTS)]
    kind = i % 4
    if kind == 0:  # sampled, tier 0: statistical only
        return "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0.7}, 0
    if kind == 1:  # seeded sampling: request-level reproducible (tier 1)
        body = {"prompt": prompt, "max_tokens": 12, "temperature": 0.8, "seed": 1234 + i}
        return "/v1/completions", body, 1
    chat = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 10, "temperature": 0}
    if kind == 2:
        return "/v1/chat/completions", {**chat, "stream": True}, 2 if pool == "strict" else 1
    return "/v1/chat/completions", {**chat, "logprobs": True}, 2 if pool == "strict" else 0


def send(url: str, endpoint: str, body: dict[str, Any], tier: int) -> httpx.Response:
    with httpx.Client(timeout=300) as http:
        return http.post(
            url + endpoint,
            json={"model": "fixture", **body},
            headers={"X-Reproducibility-Tier": str(tier)},
        )


def wait_record(client: LedgerClient, request_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.get_record(request_id)
        except NotFound:
            if time.monotonic() > deadline:
                raise DemoTrouble(
                    f"record {request_id} did not reach the ledger within {timeout:.0f} s"
                ) from None
            time.sleep(0.1)


def traffic(
    workers: dict[str, Worker], client: LedgerClient, keys: Mapping[str, SigningKey]
) -> tuple[Rows, dict[str, list[str]], str]:
    """Concurrent mixed traffic on both pools; returns rows, IDs per pool and the ID of a
    tier-2 greedy completion on the strict pool whose logprob bits were checked (``keys``:
    each pool's collector key)."""
    strict, throughput = workers["strict"], workers["throughput"]
    rows: Rows = [
        (
            f"pool {w.pool}",
            f"collector {w.url} -> vLLM {w.engine.url}; fingerprint "
            f"{w.collector.state.fingerprint_id}, batch invariance "
            f"{w.collector.state.batch_invariance}",
        )
        for w in workers.values()
    ]
    checked = send(
        strict.url,
        "/v1/completions",
        {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "logprobs": 1},
        2,
    )
    if checked.status_code != 200:
        raise DemoTrouble(
            f"the strict collector answered {checked.status_code}: {checked.text[:300]}"
        )
    checked_id = checked.headers["x-request-id"]
    jobs = [(w, *mixed_request(w.pool, i)) for w in (strict, throughput) for i in range(12)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda j: send(j[0].url, j[1], j[2], j[3]), jobs))
    ids: dict[str, list[str]] = {"strict": [checked_id], "throughput": []}
    for (worker, _, _, _), answer in zip(jobs, answers, strict=True):
        if answer.status_code != 200:
            raise DemoTrouble(f"{worker.pool} answered {answer.status_code}: {answer.text[:300]}")
        ids[worker.pool].append(answer.headers["x-request-id"])
    refused = send(throughput.url, "/v1/completions", {"prompt": "x", "temperature": 0}, 2)
    rows.append(
        (
            "traffic",
            f"{len(jobs)} concurrent requests (chat and completions, streamed or not, "
            "tiers 0-2) through both collectors",
        )
    )
    rows.append(
        (
            "tier 2 on the throughput pool",
            f"refused: HTTP {refused.status_code} {refused.json()['error']['code']}",
        )
    )
    for request_id in [*ids["strict"], *ids["throughput"]]:
        wait_record(client, request_id)
    record = wait_record(client, checked_id)
    verify_envelope(Envelope.from_dict(record["envelope"]), keys["strict"].public_key)
    raw = base64.b64decode(body_view(record)["choices"][0]["logprobs"])
    answered = checked.json()["choices"][0]["logprobs"]["token_logprobs"]
    if struct.pack(f"<{len(answered)}f", *answered) != raw:
        raise CheckFailed("the recorded logprobs differ from the ones the client was answered")
    rows.append(
        (
            "records in the ledger",
            f"{sum(map(len, ids.values()))} signed records; {checked_id} (tier 2): "
            f"{len(raw) // 4} logprob bits equal to the answer",
        )
    )
    return rows, ids, checked_id


def replays(client: LedgerClient, ids: dict[str, list[str]]) -> Rows:
    """Replay strict records (bitwise), a throughput record (no matching pool), and a strict
    record forced onto the throughput pool (not comparable, with the fingerprint diff)."""
    rows: Rows = []
    strict = [
        r for r in ids["strict"] if is_deterministic(body_view(client.get_record(r))["request"])
    ][:5]
    for request_id in strict:
        verdict = client.replay(request_id, None, False)["envelope"]["body"]
        if verdict["verdict"] != "bitwise":
            raise CheckFailed(
                f"strict record {request_id} replayed {verdict['verdict']}: {verdict}"
            )
    rows.append(
        (
            f"replay {len(strict)} strict records",
            "bitwise, every logprob bit (greedy and seeded; signed verdicts in the log)",
        )
    )
    try:
        client.replay(ids["throughput"][0], None, False)
        raise CheckFailed("a record of the batch-variant pool found a matching pool")
    except Conflict as exc:
        nearest = exc.details.get("nearest_pools") or []
        named = ", ".join(f"{p['pool']} ({p['differences']} differences)" for p in nearest)
        rows.append((f"replay {ids['throughput'][0]}", f"409 {exc.code}; nearest: {named}"))
    forced = client.replay(strict[0], "throughput", True)["envelope"]["body"]
    causes = [d["path"] for d in forced["fingerprint_diff"] or [] if not d["derived"]]
    rows.append(
        (
            "forced onto throughput",
            f"{forced['verdict']} (observed {forced['comparison']['verdict']}); "
            f"differs in {', '.join(causes[:4])}",
        )
    )
    return rows


def cache_lookup(client: LedgerClient, request_id: str) -> Rows:
    record = client.get_record(request_id)
    body = body_view(record)
    request = {k: v for k, v in body["request"].items() if k != "return_token_ids"}
    key = client.cache_key(
        {"endpoint": body["endpoint"], "request": request, "fingerprint_id": body["fingerprint_id"]}
    )["key"]
    hit = client.cache_lookup(key)
    if hit["request_id"] != request_id:
        raise CheckFailed(f"cache key {key} answered {hit['request_id']}, not {request_id}")
    return [("cache lookup", f"{key} -> {request_id} (tier {body['tier']}, greedy)")]


def run_certification(client: LedgerClient, params: dict[str, Any]) -> dict[str, Any]:
    """Start a certification and poll it to its end; the finished job (fails otherwise)."""
    job = client.certify(params)
    log.info(f"certifying pool {params['pool']} ({job['total']} probes) ...")
    while job["status"] == "running":
        time.sleep(0.5)
        job = client.certification(job["certification_id"])
    if job["status"] != "done":
        raise DemoTrouble(f"certifying {params['pool']} failed: {job['error']}")
    return job


def certify(client: LedgerClient, pool: str) -> tuple[str, str]:
    params = {"pool": pool, "prompts": 6, "concurrency": [1, 6], "max_tokens": [16]}
    job = run_certification(client, params)
    body = job["envelope"]["body"]
    cells = ", ".join(
        f"c={r['concurrency']}: {r['bitwise']}/{r['requests']} bitwise" for r in body["results"]
    )
    invariant = body["invariant_observed"]
    if pool == "strict" and not invariant:
        raise CheckFailed(f"the strict pool did not certify as invariant: {cells}")
    label = "invariant" if invariant else "NOT invariant"
    return f"certify {pool}", f"{label} ({cells}); certificate at log leaf {job['log_index']}"
