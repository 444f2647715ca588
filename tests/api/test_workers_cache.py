"""Workers, pools, replay refusals and cache lookups through the API, on SQLite and Postgres
(synthetic records; replays on real engines are in test_replay.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import update

from ledger.cachekey import cache_key
from ledger.storage.models import Worker
from tests.support.collector import ints
from tests.support.harness import Harness
from tests.support.workers import (
    engine_deriving,
    heartbeat,
    post_heartbeat,
    register_fingerprint,
)


def _setup(api: Harness, invariance: str = "serial", url: str = "http://127.0.0.1:9") -> dict:
    """A collector key, a fingerprint whose engine section derives ``invariance``, and a worker
    registered by a heartbeat signed with that key."""
    key = api.collector()
    fp = register_fingerprint(api, key, engine_deriving(invariance))
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    worker = {"worker_id": f"w-{uuid.uuid4().hex[:8]}", "pool": pool, "url": url}
    response = post_heartbeat(api, heartbeat(key, **worker, fingerprint_id=fp))
    assert response.status_code == 200, response.text
    return {"key": key, "fp": fp, "pool": pool, "worker": worker}


def test_heartbeat_registers_and_refreshes(api: Harness) -> None:
    s = _setup(api)
    client = api.client()
    pool = client.get(f"/v1/pools/{s['pool']}").json()
    assert pool["live_workers"] == 1 and pool["batch_invariance"] == ["serial"]
    (worker,) = pool["workers"]
    assert worker["key_id"] == s["key"].key_id and worker["problem"] is None
    first_seen = worker["last_seen"]
    moved = heartbeat(
        s["key"], **{**s["worker"], "url": "http://127.0.0.1:10"}, fingerprint_id=s["fp"]
    )
    again = post_heartbeat(api, moved).json()
    assert (
        again["url"] == "http://127.0.0.1:10" and again["registered_at"] == worker["registered_at"]
    )
    assert again["last_seen"] >= first_seen
    assert client.get("/v1/pools/nowhere").status_code == 404
    reader = api.client(api.token("records:read"))
    assert reader.post("/v1/workers", content=moved.canonical).status_code == 403


def _record(api: Harness, s: dict[str, Any], **kw: Any) -> str:
    env = api.record(s["key"], s["fp"], **kw)
    assert api.post([env]).status_code == 201
    return str(env.body["request_id"])


def test_a_silent_worker_is_not_live_and_gets_no_replays(api: Harness) -> None:
    s = _setup(api)
    request_id = _record(api, s)
    with api.db.write() as session:
        session.execute(
            update(Worker)
            .where(Worker.worker_id == s["worker"]["worker_id"])
            .values(last_seen=datetime.now(UTC) - timedelta(minutes=5))
        )
    client = api.client()
    assert client.get(f"/v1/pools/{s['pool']}").json()["live_workers"] == 0
    response = client.post("/v1/replays", json={"request_id": request_id, "pool": s["pool"]})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "no_matching_pool"


def test_a_worker_that_does_not_answer_yields_a_logged_error_verdict(api: Harness) -> None:
    s = _setup(api)  # its URL is a closed port
    request_id = _record(api, s)
    response = api.client().post("/v1/replays", json={"request_id": request_id})
    assert response.status_code == 201, response.text
    verdict = response.json()["envelope"]["body"]
    assert verdict["verdict"] == "error" and "worker_unreachable" in verdict["reason"]
    assert verdict["output"] is None and verdict["comparison"] is None
    listed = api.client().get(f"/v1/records/{request_id}").json()["replays"]
    assert [r["verdict"] for r in listed] == ["error"]


def test_a_batch_variant_worker_never_matches(api: Harness) -> None:
    s = _setup(api, invariance="none")
    request_id = _record(api, s)
    response = api.client().post("/v1/replays", json={"request_id": request_id})
    assert response.status_code == 409
    nearest = response.json()["error"]["details"]["nearest_pools"]
    mine = next(p for p in nearest if p["pool"] == s["pool"])
    assert mine["differences"] == 0 and mine["batch_invariance"] == "none"


def test_cache_lookup_needs_tier_one_and_determinism(api: Harness) -> None:
    s = _setup(api)
    client = api.client()
    greedy = {"temperature": 0}
    hit_id = _record(api, s, tier=1, request_extra=greedy, text_prompt=True)
    body = client.get(f"/v1/records/{hit_id}").json()["envelope"]["body"]
    key = client.post(
        "/v1/cache/key",
        json={"endpoint": "/v1/completions", "request": body["request"], "fingerprint_id": s["fp"]},
    ).json()["key"]
    assert key == cache_key("/v1/completions", body["request"], s["fp"])
    hit = client.get(f"/v1/cache/{key}")
    assert hit.status_code == 200 and hit.json()["request_id"] == hit_id
    # the same record found by the token IDs the engine saw
    ids = cache_key(
        "/v1/completions",
        body["request"],
        s["fp"],
        prompt_token_ids=ints(body["prompt_token_ids"]),
    )
    assert client.get(f"/v1/cache/{ids}").json()["request_id"] == hit_id
    # sampled without a seed: the key exists but is no cache answer
    sampled_id = _record(api, s, tier=2, text_prompt=True, seed=7)
    sampled = client.get(f"/v1/records/{sampled_id}").json()["envelope"]["body"]
    miss = client.get(f"/v1/cache/{cache_key('/v1/completions', sampled['request'], s['fp'])}")
    assert miss.status_code == 404
    assert "non-deterministic" in miss.json()["error"]["message"]
    # seeded sampling qualifies
    seeded_id = _record(api, s, tier=1, request_extra={"seed": 11}, seed=8)
    seeded = client.get(f"/v1/records/{seeded_id}").json()["envelope"]["body"]
    seeded_key = cache_key("/v1/completions", seeded["request"], s["fp"])
    assert client.get(f"/v1/cache/{seeded_key}").json()["request_id"] == seeded_id
    unknown_fp = client.post(
        "/v1/cache/key",
        json={
            "endpoint": "/v1/completions",
            "request": body["request"],
            "fingerprint_id": "sha256:" + "0" * 64,
        },
    )
    assert unknown_fp.status_code == 404
    bad = client.post(
        "/v1/cache/key",
        json={"endpoint": "/v1/embeddings", "request": {}, "fingerprint_id": s["fp"]},
    )
    assert bad.status_code == 422
