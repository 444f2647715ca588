"""Replay on real vLLM CPU: workers register, records replay on a matching batch-invariant pool.

Three pools, each a real engine with a collector beside it that registers as a worker:
``strict`` (serial: --max-num-seqs 1, no prefix caching, no chunked prefill), ``throughput``
(the default scheduler, batch_invariance none) and ``f32`` (strict, but --dtype float32).
"""

from __future__ import annotations

import base64
import copy
import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledger import disclosures
from ledger.errors import VerificationError
from ledger.evidence import verify_bundle
from ledger.evidence_format import load_bundle
from ledger.heartbeat import HEARTBEAT_KIND
from ledger.inference_record import body_view
from ledger.replay import ORDER_KIND, build_order
from ledger.signing import Envelope, SigningKey, load_public_key, sign_envelope, verify_envelope
from ledger.storage.audit import audit
from tests.conftest import fresh_url
from tests.support.cli import ledger
from tests.support.collector import RunningCollector, ints, start_collector, wait_for_record
from tests.support.engine import EngineServer
from tests.support.harness import Harness, start_harness

pytestmark = pytest.mark.engine
PROMPTS = [
    "The ledger",
    "Replay this request and tell me whether the numbers come back the same, bit for bit,",
    "Once upon a time",
    "A much longer prompt that keeps going so that the batch has requests of mixed lengths "
    "in it, which is what moves the reduction order on a batch-variant engine, token by token",
    "Zebra",
    "Compliance officers ask",
    "Seven",
    "What changed between these two fingerprints?",
]


@dataclass
class Pools:
    api: Harness
    strict: RunningCollector
    throughput: RunningCollector
    f32: RunningCollector


@pytest.fixture(scope="module")
def pools(
    engines: dict[str, EngineServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pools]:
    root = tmp_path_factory.mktemp("replay")
    api = start_harness("sqlite", f"sqlite:///{root / 'ledger.db'}", root / "api")
    started = []
    try:
        for name, engine in (("strict", "strict"), ("throughput", "default"), ("f32", "f32")):
            running = start_collector(
                engines[engine], api, root / name, pool=name, worker_id=name, register=True
            )
            started.append(running)
            assert running.collector.registered.wait(60), f"{name} did not register"
        yield Pools(api, *started)
    finally:
        for running in started:
            running.close()
        api.close()


def send(collector: RunningCollector, prompt: str, tier: int | None = None, **extra: Any) -> str:
    body = {"model": "fixture", "prompt": prompt, "max_tokens": 16, "temperature": 0, **extra}
    headers = {"X-Reproducibility-Tier": str(tier)} if tier is not None else {}
    response = httpx.post(
        f"{collector.url}/v1/completions", json=body, headers=headers, timeout=120
    )
    assert response.status_code == 200, response.text
    return response.headers["x-request-id"]


def replay(api: Harness, request_id: str, **kw: Any) -> httpx.Response:
    return api.client().post("/v1/replays", json={"request_id": request_id, **kw}, timeout=300)


def test_pools_list_workers_fingerprints_and_invariance(pools: Pools) -> None:
    items = {p["pool"]: p for p in pools.api.client().get("/v1/pools").json()["items"]}
    assert set(items) == {"strict", "throughput", "f32"}
    assert items["strict"]["batch_invariance"] == ["serial"]
    assert items["throughput"]["batch_invariance"] == ["none"]
    assert items["strict"]["live_workers"] == 1
    (worker,) = items["strict"]["workers"]
    assert worker["url"] == pools.strict.url and worker["live"]
    assert worker["fingerprint_id"] == pools.strict.collector.state.fingerprint_id
    assert items["f32"]["fingerprint_ids"] != items["strict"]["fingerprint_ids"]


def test_strict_records_made_under_load_replay_bitwise(pools: Pools) -> None:
    with ThreadPoolExecutor(len(PROMPTS)) as ex:
        ids = list(ex.map(lambda p: send(pools.strict, p), PROMPTS))
    for request_id in ids:
        wait_for_record(pools.api, request_id)
    spooled = pools.strict.collector.metrics.registry.get_sample_value
    spooled_before = spooled("collector_records_spooled_total")
    for request_id in ids:
        response = replay(pools.api, request_id)
        assert response.status_code == 201, response.text
        verdict = response.json()["envelope"]["body"]
        assert verdict["verdict"] == "bitwise", verdict["comparison"]
        assert verdict["pool"] == "strict" and verdict["worker_id"] == "strict"
        assert verdict["worker_key_id"] == pools.strict.collector.config.key.key_id
        # the record is schema v2: the verdict commits to the output, stored apart
        assert verdict["output"] is None and verdict["output_digest"].startswith("sha256:")
        fetched = pools.api.client().get(f"/v1/replays/{verdict['replay_id']}").json()
        (kept,) = fetched["disclosures"]
        opened = disclosures.parse(kept)
        assert opened.digest == verdict["output_digest"] and opened.member == "replay_output"
        signed_output = opened.value
        assert signed_output["signature"]["key_id"] == verdict["worker_key_id"]
        comparison = verdict["comparison"]
        assert comparison["prompt_equal"] and comparison["first_divergence"] is None
        (choice,) = comparison["choices"]
        assert choice["logprobs_compared"] == choice["recorded_tokens"] > 0
        assert choice["logprobs_differing"] == 0
        # the replayed output inside the verdict carries the bits that were compared
        record = wait_for_record(pools.api, request_id)
        output = signed_output["body"]
        assert output["choices"][0]["logprobs"] == record["choices"][0]["logprobs"]
        assert output["choices"][0]["token_ids"] == record["choices"][0]["token_ids"]
    # a replay is not traffic: nothing new was spooled or recorded
    assert spooled("collector_records_spooled_total") == spooled_before
    assert spooled("collector_replays_total") >= len(ids)
    listed = pools.api.client().get("/v1/records", params={"pool": "strict"}).json()
    assert {i["request_id"] for i in listed["items"]} == set(ids)


def test_a_verdict_is_signed_logged_and_listed_with_its_record(pools: Pools) -> None:
    request_id = send(pools.strict, "Signed verdicts")
    wait_for_record(pools.api, request_id)
    created = replay(pools.api, request_id).json()
    client = pools.api.client()
    fetched = client.get(f"/v1/replays/{created['replay_id']}").json()
    assert fetched["envelope"] == created["envelope"]
    env = Envelope.from_dict(fetched["envelope"])
    assert env.kind == "replay_verdict"
    log_key = load_public_key(client.get("/v1/log/key").json()["public_key"])
    verify_envelope(env, log_key)
    record = client.get(f"/v1/records/{request_id}").json()
    assert [r["replay_id"] for r in record["replays"]] == [created["replay_id"]]
    assert record["replays"][0]["verdict"] == "bitwise"
    report = audit(pools.api.db, log_key)
    assert report.ok, report.to_dict()


@pytest.mark.postgres
def test_record_replay_prove_erase_on_postgres(
    engines: dict[str, EngineServer],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> None:
    """Real vLLM, a real collector, a ledger on Postgres: a v2 record and its replay are
    proven, erased (the replay output with them), and the audit holds before and after."""
    root = tmp_path_factory.mktemp("erase-pg")
    api = start_harness("postgres", fresh_url(request, "postgres"), root / "api")
    running = start_collector(
        engines["strict"], api, root / "c", pool="strict", worker_id="pg-strict", register=True
    )
    try:
        assert running.collector.registered.wait(60)
        request_id = send(running, "Erase me, please")
        record = wait_for_record(api, request_id)
        assert record["schema_version"] == 2
        verdict = replay(api, request_id).json()["envelope"]["body"]
        assert verdict["verdict"] == "bitwise" and verdict["output"] is None
        client = api.client()
        assert client.post("/v1/log/checkpoint").status_code in (200, 201)  # covers the verdict
        full = client.get(f"/v1/records/{request_id}/evidence").json()
        log_key = api.log_key.public_key
        verified = verify_bundle(load_bundle(json.dumps(full).encode()), log_key)
        assert {i.status for i in verified.content.items} == {"disclosed"}
        assert verified.replay_verdicts == ("bitwise",)
        assert audit(api.db, log_key).ok
        erased = client.post(f"/v1/records/{request_id}/erasure", json={"reason": "Art. 17"})
        assert erased.status_code == 201, erased.text
        # the record's digests and the replay output's
        assert (
            erased.json()["erased_digests"]
            == len(full["envelope"]["body"]["disclosure_digests"]) + 1
        )
        gone = client.get(f"/v1/replays/{verdict['replay_id']}").json()
        assert "disclosures" not in gone
        again = replay(api, request_id)
        assert again.status_code == 410 and again.json()["error"]["code"] == "content_erased"
        assert verify_bundle(load_bundle(json.dumps(full).encode()), log_key).content
        after = client.get(f"/v1/records/{request_id}/evidence").json()
        verified = verify_bundle(load_bundle(json.dumps(after).encode()), log_key)
        assert {i.status for i in verified.content.items} == {"erased"}
        report = audit(api.db, log_key)
        assert report.ok, report.to_dict()
    finally:
        running.close()
        api.close()


def test_no_matching_pool_lists_the_nearest_with_their_differences(pools: Pools) -> None:
    request_id = send(pools.throughput, "Batch-variant pool")
    wait_for_record(pools.api, request_id)
    response = replay(pools.api, request_id)
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "no_matching_pool"
    nearest = {p["pool"]: p for p in error["details"]["nearest_pools"]}
    # its own pool has the same fingerprint but is not batch-invariant
    assert nearest["throughput"]["differences"] == 0
    assert nearest["throughput"]["batch_invariance"] == "none"
    paths = {d["path"] for d in nearest["strict"]["diff"]}
    assert "engine.max_num_seqs" in paths and "engine.batch_invariance" in paths


def test_forced_replay_on_a_float32_pool_is_not_comparable(pools: Pools) -> None:
    request_id = send(pools.strict, "Upgrade drift")
    wait_for_record(pools.api, request_id)
    response = replay(pools.api, request_id, pool="f32", force=True)
    assert response.status_code == 201, response.text
    verdict = response.json()["envelope"]["body"]
    assert verdict["verdict"] == "not_comparable" and verdict["forced"]
    dtype = [d for d in verdict["fingerprint_diff"] if d["path"] == "engine.dtype"]
    assert dtype and dtype[0]["before"] == "bfloat16" and dtype[0]["after"] == "float32"
    comparison = verdict["comparison"]
    assert comparison["prompt_equal"]
    # bf16 and f32 arithmetic never give the same logprob bits
    assert comparison["verdict"] in ("tokens_match_logprobs_drift", "diverged")
    assert comparison["choices"][0]["logprobs_differing"] > 0
    assert comparison["choices"][0]["max_abs_logprob_delta"] > 0


def test_replay_refusals(pools: Pools) -> None:
    missing = replay(pools.api, "req-never-recorded")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "record_not_found"
    request_id = send(pools.strict, "Refusals")
    wait_for_record(pools.api, request_id)
    no_pool = replay(pools.api, request_id, force=True)
    assert no_pool.status_code == 422 and no_pool.json()["error"]["code"] == "pool_required"
    unknown = replay(pools.api, request_id, pool="nowhere")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "pool_not_found"
    reader = pools.api.client(pools.api.token("records:read"))
    denied = reader.post("/v1/replays", json={"request_id": request_id})
    assert denied.status_code == 403


def _order(worker_id: str, key: SigningKey) -> bytes:
    body = json.dumps({"model": "fixture", "prompt": "x", "max_tokens": 2}).encode()
    order = build_order(
        replay_id=f"rpl-{uuid.uuid4().hex}",
        request_id="req-forged",
        worker_id=worker_id,
        endpoint="/v1/completions",
        request_raw=base64.b64encode(body).decode(),
    )
    return sign_envelope(ORDER_KIND, order, key).canonical


def test_the_collector_takes_only_orders_signed_by_the_log_key(pools: Pools) -> None:
    url = f"{pools.strict.url}/ledger/v1/replay"
    forged = httpx.post(url, content=_order("strict", SigningKey.generate()), timeout=30)
    assert forged.status_code == 403
    assert forged.json()["error"]["code"] == "not_signed_by_ledger"
    other_worker = httpx.post(url, content=_order("f32", pools.api.log_key), timeout=30)
    assert other_worker.status_code == 400
    order = _order("strict", pools.api.log_key)
    good = httpx.post(url, content=order, timeout=60)
    assert good.status_code == 200, good.text
    assert Envelope.from_dict(good.json()).kind == "replay_output"
    again = httpx.post(url, content=order, timeout=60)  # a captured order, sent again
    assert again.status_code == 403 and again.json()["error"]["code"] == "order_replayed"


def test_cache_answers_deterministic_tier1_records_by_key(pools: Pools) -> None:
    client = pools.api.client()
    fp = pools.strict.collector.state.fingerprint_id
    prompt = "Cache me"
    request_id = send(pools.strict, prompt, tier=1, max_tokens=8)
    record = wait_for_record(pools.api, request_id)
    request = {"model": "fixture", "prompt": prompt, "max_tokens": 8, "temperature": 0}
    key = client.post(
        "/v1/cache/key",
        json={
            "endpoint": "/v1/completions",
            "request": {**request, "stream": True},
            "fingerprint_id": fp,
        },
    ).json()["key"]
    hit = client.get(f"/v1/cache/{key}")
    assert hit.status_code == 200, hit.text
    assert hit.json()["request_id"] == request_id
    assert body_view(hit.json())["choices"] == record["choices"]
    # the same prompt as the token IDs the engine saw finds it too
    ids = client.post(
        "/v1/cache/key",
        json={
            "endpoint": "/v1/completions",
            "request": request,
            "fingerprint_id": fp,
            "prompt_token_ids": list(ints(record["prompt_token_ids"])),
        },
    ).json()["key"]
    assert client.get(f"/v1/cache/{ids}").json()["request_id"] == request_id
    # never across fingerprints
    other = pools.f32.collector.state.fingerprint_id
    elsewhere = client.post(
        "/v1/cache/key",
        json={"endpoint": "/v1/completions", "request": request, "fingerprint_id": other},
    ).json()["key"]
    assert elsewhere != key
    assert client.get(f"/v1/cache/{elsewhere}").status_code == 404
    # a tier-0 record is not a cache answer, and the miss says why
    tier0 = {**request, "prompt": "Tier zero"}
    wait_for_record(pools.api, send(pools.strict, "Tier zero", max_tokens=8))
    k0 = client.post(
        "/v1/cache/key",
        json={"endpoint": "/v1/completions", "request": tier0, "fingerprint_id": fp},
    ).json()["key"]
    miss = client.get(f"/v1/cache/{k0}")
    assert miss.status_code == 404 and "tier 0" in miss.json()["error"]["message"]


def test_chat_records_key_by_messages_and_template(pools: Pools) -> None:
    client = pools.api.client()
    fp = pools.strict.collector.state.fingerprint_id
    body = {
        "model": "fixture",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 6,
        "temperature": 0,
    }
    response = httpx.post(
        f"{pools.strict.url}/v1/chat/completions",
        json=body,
        headers={"X-Reproducibility-Tier": "2"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    request_id = response.headers["x-request-id"]
    wait_for_record(pools.api, request_id)
    key = client.post(
        "/v1/cache/key",
        json={"endpoint": "/v1/chat/completions", "request": body, "fingerprint_id": fp},
    ).json()["key"]
    assert client.get(f"/v1/cache/{key}").json()["request_id"] == request_id
    verdict = replay(pools.api, request_id).json()["envelope"]["body"]
    assert verdict["verdict"] == "bitwise", verdict["comparison"]


def test_worker_registration_is_checked(pools: Pools) -> None:
    writer = pools.api.client(pools.api.token("records:write"))
    collector = pools.strict.collector
    good = collector.heartbeat_envelope()  # signed by the collector's key, as it sends them
    for change, code in (
        ({"fingerprint_id": "sha256:" + "0" * 64}, "unknown_fingerprint"),
        ({"url": "ftp://x"}, "invalid_url"),
        ({"url": "http://169.254.169.254/"}, "url_not_allowed"),
        ({"batch_invariance": "serial"}, "schema_violation"),
    ):
        env = sign_envelope(HEARTBEAT_KIND, {**good.body, **change}, collector.config.key)
        response = writer.post("/v1/workers", content=env.canonical)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == code
    # the same heartbeat signed by another registered collector key: the worker is not its
    takeover = sign_envelope(HEARTBEAT_KIND, good.body, pools.api.collector())
    response = writer.post("/v1/workers", content=takeover.canonical)
    assert response.status_code == 409 and response.json()["error"]["code"] == "worker_conflict"
    unsigned = writer.post("/v1/workers", json=good.body)
    assert unsigned.status_code == 422


def certify(api: Harness, pool: str, **params: Any) -> dict[str, Any]:
    client = api.client()
    started = client.post("/v1/certifications", json={"pool": pool, **params})
    assert started.status_code == 202, started.text
    job = started.json()
    deadline = time.monotonic() + 600
    while job["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.5)
        job = client.get(f"/v1/certifications/{job['certification_id']}").json()
    assert job["status"] == "done", job
    assert job["done"] == job["total"]
    return job


def test_certify_reports_what_the_default_scheduler_does(pools: Pools) -> None:
    """The default pool claims no batch invariance; its certificate says what was observed.

    Whether batching moves this engine's numerics depends on the CPU's kernels: on the hosts
    this suite first ran on (CPU flags not recorded), every wave of 8 diverged (0 of 8
    bitwise); on an AVX2-only AMD EPYC, 16 of 16 probes came back bitwise, run after run.
    So this checks that the certificate agrees with its own figures whichever way the host
    goes; that a divergence is reported as not invariant is checked on fixed outputs
    (tests/ledger/test_replay_documents.py), and real engines that differ (bf16 against f32)
    are compared in the forced-replay test."""
    job = certify(pools.api, "throughput", prompts=8, concurrency=[8], max_tokens=[32])
    body = job["envelope"]["body"]
    cells = {r["concurrency"]: r for r in body["results"]}
    assert set(cells) == {1, 8}
    assert cells[1]["bitwise_rate"] == 1.0  # alone, it repeats itself
    assert cells[8]["requests"] == 8
    assert cells[8]["bitwise_rate"] == cells[8]["bitwise"] / 8
    assert body["invariant_observed"] is (cells[8]["bitwise"] == 8)
    # every comparison whose tokens differ has a first divergence; bitwise ones have equal tokens
    assert len(cells[8]["first_divergences"]) == 8 - cells[8]["exact_tokens"]
    assert cells[8]["exact_tokens"] >= cells[8]["bitwise"]
    assert body["batch_invariance"] == "none"
    assert cells[8]["min_margin"] is not None and cells[8]["min_margin"] >= 0


def test_certify_reports_the_strict_pool_bitwise_and_logs_the_certificate(
    pools: Pools, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(pools.api.token("replay", "records:read"))
    proc = ledger(
        "certify",
        "--pool",
        "strict",
        "--prompts",
        "6",
        "--concurrency",
        "1,6",
        "--max-tokens",
        "16",
        "--api",
        pools.api.url,
        "--token-file",
        str(token),
        "--json",
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = json.loads(proc.stdout)
    body = job["envelope"]["body"]
    assert body["invariant_observed"] is True
    assert [(r["concurrency"], r["bitwise"], r["requests"]) for r in body["results"]] == [
        (1, 6, 6),
        (6, 6, 6),
    ]
    stored = pools.api.client().get(f"/v1/certificates/{body['certificate_id']}").json()
    assert stored["envelope"] == job["envelope"] and stored["log_index"] == job["log_index"]
    log_key = load_public_key(pools.api.client().get("/v1/log/key").json()["public_key"])
    verify_envelope(Envelope.from_dict(stored["envelope"]), log_key)
    assert audit(pools.api.db, log_key).ok
    table = ledger(
        "certify",
        "--pool",
        "strict",
        "--prompts",
        "2",
        "--concurrency",
        "2",
        "--max-tokens",
        "4",
        "--api",
        pools.api.url,
        "--token-file",
        str(token),
        check=False,
        timeout=600,
        env={"COLUMNS": "200"},
    )
    assert table.returncode == 0, table.stdout + table.stderr
    assert "invariant: every result bitwise" in table.stdout
    assert "100%" in table.stdout and "log leaf" in table.stdout


def test_certify_refusals(pools: Pools) -> None:
    client = pools.api.client()
    unknown = client.post("/v1/certifications", json={"pool": "nowhere"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "pool_not_found"
    too_long = client.post("/v1/certifications", json={"pool": "strict", "max_tokens": [1000]})
    assert too_long.status_code == 422
    assert too_long.json()["error"]["code"] == "invalid_parameters"
    missing = client.get("/v1/certifications/cert-" + "0" * 32)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "job_not_found"
    malformed = client.get("/v1/certifications/cert-nope")
    assert malformed.status_code == 422
    assert malformed.json()["error"]["code"] == "invalid_parameters"


def test_evidence_carries_the_replay_verdicts(pools: Pools) -> None:
    request_id = send(pools.strict, "Evidence with verdicts")
    wait_for_record(pools.api, request_id)
    assert replay(pools.api, request_id).status_code == 201
    client = pools.api.client()
    client.post("/v1/log/checkpoint")
    bundle = client.get(f"/v1/records/{request_id}/evidence").json()
    log_key = load_public_key(client.get("/v1/log/key").json()["public_key"])
    assert verify_bundle(bundle, log_key).replay_verdicts == ("bitwise",)
    forged = copy.deepcopy(bundle)
    forged["replays"][0]["envelope"]["body"]["verdict"] = "diverged"
    with pytest.raises(VerificationError) as failed:
        verify_bundle(forged, log_key)
    assert failed.value.details["check"] == "replays"


def test_the_replay_cli_prints_the_verdict_and_exits_by_it(pools: Pools, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(pools.api.token("replay", "records:read"))
    common = ("--api", pools.api.url, "--token-file", str(token))
    strict_id = send(pools.strict, "The CLI replays")
    throughput_id = send(pools.throughput, "The CLI refuses")
    wait_for_record(pools.api, strict_id)
    wait_for_record(pools.api, throughput_id)
    ok = ledger("replay", strict_id, *common, check=False, timeout=300, env={"COLUMNS": "200"})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "bitwise" in ok.stdout and "strict" in ok.stdout
    as_json = ledger("replay", strict_id, *common, "--json", check=False, timeout=300)
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout)["envelope"]["body"]["verdict"] == "bitwise"
    forced = ledger(
        "replay",
        strict_id,
        "--pool",
        "f32",
        "--force",
        *common,
        check=False,
        timeout=300,
        env={"COLUMNS": "200"},
    )
    assert forced.returncode == 1 and "not_comparable" in forced.stdout
    assert "engine.dtype" in forced.stdout
    refused = ledger("replay", throughput_id, *common, check=False, timeout=300)
    assert refused.returncode == 2 and "[no_matching_pool]" in refused.stderr
    missing = ledger("replay", "req-nothing", *common, check=False)
    assert missing.returncode == 2 and "record_not_found" in missing.stderr
