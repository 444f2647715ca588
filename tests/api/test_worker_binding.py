"""Workers bound to keys, through the API on SQLite and Postgres (real HTTP, real signatures,
a real HTTP server playing the attacker's fake worker).

The attack this closes: with a ``records:write`` token and a collector key of one's own,
register another collector's ``worker_id`` at a URL one controls, answer the replay of the
victim's record with an output signed by one's own key, and have the ledger log a ``bitwise``
verdict for the victim's worker. And its neighbours: unsigned, stale or replayed heartbeats,
revoked keys, URLs aimed at metadata services, claimed batch invariance, edited worker rows.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update
from starlette.responses import JSONResponse, Response, StreamingResponse

from ledger.certify import MAX_PROBES, MAX_PROMPT_CHARS
from ledger.heartbeat import MAX_SKEW
from ledger.signing import SigningKey, sign_envelope
from ledger.storage.models import Worker
from tests.support.harness import Harness
from tests.support.workers import (
    FakeWorker,
    heartbeat,
    post_heartbeat,
    register_fingerprint,
    serial_engine,
)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _worker(api: Harness, worker_id: str) -> dict[str, Any]:
    items = api.client().get("/v1/workers").json()["items"]
    (found,) = [w for w in items if w["worker_id"] == worker_id]
    return found


def _register(api: Harness, key: SigningKey, fp: str, url: str, **kw: Any) -> dict[str, Any]:
    ids = {"worker_id": kw.pop("worker_id", _name("w")), "pool": kw.pop("pool", _name("pool"))}
    response = post_heartbeat(api, heartbeat(key, **ids, url=url, fingerprint_id=fp, **kw))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _record(api: Harness, key: SigningKey, fp: str) -> dict[str, Any]:
    env = api.record(key, fp, request_extra={"temperature": 0})
    assert api.post([env]).status_code == 201
    return env.body


def _replay(api: Harness, request_id: str, pool: str) -> dict[str, Any]:
    response = api.client().post("/v1/replays", json={"request_id": request_id, "pool": pool})
    assert response.status_code == 201, response.text
    verdict: dict[str, Any] = response.json()["envelope"]["body"]
    return verdict


def _error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code, response.text


def _fake(
    fakes: list[FakeWorker], key: SigningKey, record: dict[str, Any], **kw: Any
) -> FakeWorker:
    fake = FakeWorker(key, record, **kw).start()
    fakes.append(fake)
    return fake


# ---- the takeover and the forged verdict ---------------------------------------------------


def test_another_key_cannot_take_a_worker_over(api: Harness) -> None:
    victim, attacker = api.collector(), api.collector()
    fp = register_fingerprint(api, victim, serial_engine())
    mine = _register(api, victim, fp, "http://127.0.0.1:9", worker_id=_name("victim"))
    before = _worker(api, mine["worker_id"])
    for url, pool in (("http://127.0.0.1:666", mine["pool"]), ("http://127.0.0.1:9", "other")):
        takeover = heartbeat(
            attacker, worker_id=mine["worker_id"], pool=pool, url=url, fingerprint_id=fp
        )
        response = post_heartbeat(api, takeover)
        _error(response, 409, "worker_conflict")
        assert response.json()["error"]["details"]["key_id"] == victim.key_id
    after = _worker(api, mine["worker_id"])
    assert after == {**before, "live": after["live"]}  # nothing changed
    assert after["key_id"] == victim.key_id and after["url"] == "http://127.0.0.1:9"


def test_no_verdict_for_output_not_signed_by_the_workers_key(
    api: Harness, fakes: list[FakeWorker]
) -> None:
    victim, attacker = api.collector(), api.collector()
    fp = register_fingerprint(api, victim, serial_engine())
    record = _record(api, victim, fp)
    request_id = record["request_id"]
    # Control: an honest worker of the victim's (signing with the victim's key) is bitwise.
    honest = _fake(fakes, victim, record)
    good = _register(api, victim, fp, honest.url, worker_id=_name("victim"))
    verdict = _replay(api, request_id, good["pool"])
    assert verdict["verdict"] == "bitwise", verdict
    assert verdict["worker_id"] == good["worker_id"] and verdict["worker_key_id"] == victim.key_id
    assert verdict["output"]["signature"]["key_id"] == victim.key_id
    # The attacker answers at the victim's worker's URL (its host, its DNS, a proxy on the
    # way): outputs signed by the attacker's key, a perfect copy of the record.
    impostor = _fake(fakes, attacker, record)
    victims = _register(api, victim, fp, impostor.url, worker_id=_name("victim"))
    verdict = _replay(api, request_id, victims["pool"])
    assert len(impostor.orders) == 1  # it did answer
    assert verdict["verdict"] == "error" and "wrong_signer" in verdict["reason"]
    assert verdict["output"] is None and verdict["comparison"] is None
    assert verdict["worker_key_id"] == victim.key_id
    # The attacker's own worker serving the victim's fingerprint: its verdict names the
    # attacker's worker and key, never the victim's.
    own = _register(api, attacker, fp, impostor.url, worker_id=_name("attacker"))
    verdict = _replay(api, request_id, own["pool"])
    assert verdict["worker_id"] == own["worker_id"] and verdict["worker_key_id"] == attacker.key_id
    assert verdict["output"]["signature"]["key_id"] == attacker.key_id
    # ... and its output may not speak for another worker.
    liar = _fake(fakes, attacker, record, worker_id=victims["worker_id"])
    lying = _register(api, attacker, fp, liar.url, worker_id=_name("attacker"))
    verdict = _replay(api, request_id, lying["pool"])
    assert verdict["verdict"] == "error" and "wrong_order" in verdict["reason"]
    # Every verdict about the record names a worker and the key bound to it.
    listed = api.client().get(f"/v1/records/{request_id}").json()["replays"]
    bound = {good["worker_id"]: victim.key_id, victims["worker_id"]: victim.key_id}
    bound |= {own["worker_id"]: attacker.key_id, lying["worker_id"]: attacker.key_id}
    for item in listed:
        body = api.client().get(f"/v1/replays/{item['replay_id']}").json()["envelope"]["body"]
        assert body["worker_key_id"] == bound[body["worker_id"]]
        if body["output"] is not None:
            assert body["output"]["signature"]["key_id"] == body["worker_key_id"]
        if body["verdict"] == "bitwise" and body["worker_key_id"] == attacker.key_id:
            assert body["worker_id"] == own["worker_id"]
    assert {i["worker_id"] for i in listed if i["verdict"] == "bitwise"} == {
        good["worker_id"],
        own["worker_id"],
    }


def test_a_replay_naming_no_pool_goes_only_to_workers_whose_keys_may_sign_for_the_record(
    api: Harness, fakes: list[FakeWorker]
) -> None:
    """Another pool's compromised collector (its key scoped to its own pool) registers a
    worker there claiming the record's fingerprint, and heartbeats more often: a replay that
    names no pool never sends it the record's request."""
    mine, theirs = _name("pool"), _name("pool")
    owner, rogue = api.collector(pools=[mine]), api.collector(pools=[theirs])
    fp = register_fingerprint(api, owner, serial_engine())
    env = api.record(owner, fp, pool=mine, request_extra={"temperature": 0})
    assert api.post([env]).status_code == 201
    record, request_id = env.body, env.body["request_id"]
    trap = _fake(fakes, rogue, record)
    _register(api, rogue, fp, trap.url, pool=theirs)
    refused = api.client().post("/v1/replays", json={"request_id": request_id})
    _error(refused, 409, "no_matching_pool")
    # listed among the nearest pools (a requester may name it), but sent nothing
    assert theirs in {p["pool"] for p in refused.json()["error"]["details"]["nearest_pools"]}
    assert trap.orders == []
    honest = _fake(fakes, owner, record)
    own = _register(api, owner, fp, honest.url, pool=mine)
    _register(api, rogue, fp, trap.url, pool=theirs)  # the most recent heartbeat
    response = api.client().post("/v1/replays", json={"request_id": request_id})
    assert response.status_code == 201, response.text
    verdict = response.json()["envelope"]["body"]
    assert verdict["worker_id"] == own["worker_id"] and verdict["verdict"] == "bitwise"
    assert trap.orders == [] and len(honest.orders) == 1
    # a requester who names the other pool chooses it: its verdict says so
    named = _replay(api, request_id, theirs)
    assert named["pool"] == theirs and named["worker_key_id"] == rogue.key_id
    assert len(trap.orders) == 1


# ---- heartbeats: signed, fresh, newer ----------------------------------------------------


def test_unsigned_badly_signed_stale_and_old_heartbeats_are_refused(api: Harness) -> None:
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    ids = {"worker_id": _name("w"), "pool": _name("pool"), "fingerprint_id": fp}
    now = datetime.now(UTC)
    # the old, unsigned registration
    unsigned = {**ids, "url": "http://127.0.0.1:9", "batch_invariance": "serial"}
    _error(post_heartbeat(api, {**unsigned, "key_id": key.key_id}), 422, "schema_violation")
    signed = heartbeat(key, **ids, url="http://127.0.0.1:9")
    tampered = signed.to_dict()
    tampered["body"]["url"] = "http://127.0.0.1:666"
    _error(post_heartbeat(api, tampered), 422, "bad_signature")
    _error(post_heartbeat(api, heartbeat(SigningKey.generate(), **ids, url="http://127.0.0.1:9")),
           422, "unknown_key")  # fmt: skip
    wrong_kind = heartbeat(key, **ids, url="http://127.0.0.1:9", kind="replay_output")
    _error(post_heartbeat(api, wrong_kind), 422, "wrong_kind")
    for skew in (MAX_SKEW + timedelta(seconds=5), -(MAX_SKEW + timedelta(seconds=5))):
        stale = heartbeat(key, **ids, url="http://127.0.0.1:9", issued_at=now - skew)
        _error(post_heartbeat(api, stale), 422, "stale_heartbeat")
    body = heartbeat(key, **ids, url="http://127.0.0.1:9").body
    for change in ({"schema_version": True}, {"schema_version": 2}):
        env = sign_envelope("worker_heartbeat", {**body, **change}, key)
        _error(post_heartbeat(api, env), 422, "unsupported_schema_version")
    for change in ({"issued_at": "yesterday"}, {"issued_at": 5}, {"pool": "a b"}):
        env = sign_envelope("worker_heartbeat", {**body, **change}, key)
        _error(post_heartbeat(api, env), 422, "schema_violation")
    # an older heartbeat, captured and sent after a newer one, cannot roll the URL back
    old = heartbeat(key, **ids, url="http://127.0.0.1:7", issued_at=now - timedelta(seconds=10))
    new = heartbeat(key, **ids, url="http://127.0.0.1:8", issued_at=now)
    assert post_heartbeat(api, new).status_code == 200
    _error(post_heartbeat(api, old), 422, "stale_heartbeat")
    _error(post_heartbeat(api, new), 422, "stale_heartbeat")  # the same one again
    assert _worker(api, ids["worker_id"])["url"] == "http://127.0.0.1:8"
    newer = heartbeat(key, **ids, url="http://127.0.0.1:7", issued_at=now + timedelta(seconds=1))
    assert post_heartbeat(api, newer).json()["url"] == "http://127.0.0.1:7"


def test_revoked_and_non_collector_keys_are_refused(api: Harness) -> None:
    replayer = api.collector(role="replayer")
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    ids = {"pool": _name("pool"), "fingerprint_id": fp, "url": "http://127.0.0.1:9"}
    by_replayer = heartbeat(replayer, worker_id=_name("w"), **ids)
    _error(post_heartbeat(api, by_replayer), 422, "key_role_not_allowed")
    worker = _register(api, key, fp, ids["url"], pool=ids["pool"])
    request_id = _record(api, key, fp)["request_id"]
    revoked = api.client().post(f"/v1/keys/{key.key_id}/revoke", json={"reason": "stolen"})
    assert revoked.status_code == 200, revoked.text
    again = heartbeat(key, worker_id=worker["worker_id"], **ids)
    _error(post_heartbeat(api, again), 422, "revoked_key")
    # its worker is no longer live, and says why; no replay goes to it
    listed = _worker(api, worker["worker_id"])
    assert not listed["live"] and "revoked_key" in listed["problem"]
    response = api.client().post(
        "/v1/replays", json={"request_id": request_id, "pool": ids["pool"]}
    )
    _error(response, 409, "no_matching_pool")


def test_a_pool_no_worker_registered_in_is_pool_not_found_to_replays_and_certifications(
    api: Harness,
) -> None:
    key, fp = api.setup_collector()
    request_id = _record(api, key, fp)["request_id"]
    pool = _name("support")
    for forced in (False, True):
        body = {"request_id": request_id, "pool": pool, "force": forced}
        _error(api.client().post("/v1/replays", json=body), 404, "pool_not_found")
    _error(api.client().post("/v1/certifications", json={"pool": pool}), 404, "pool_not_found")


@pytest.mark.parametrize(
    "engine",
    [
        "vllm",
        [1, 2],
        7,
        {"max_model_len": True},
        {"max_model_len": 10**15},
        {"max_model_len": "4096"},
    ],
    ids=["string", "list", "number", "bool-length", "huge-length", "string-length"],
)
def test_a_certification_of_any_signed_engine_section_starts_with_bounded_probes(
    api: Harness, fakes: list[FakeWorker], engine: Any
) -> None:
    """The engine section is the collector's word, in any shape: a certification of its pool
    starts (no 500), and its longest probe prompt stays within certify.MAX_PROMPT_CHARS however
    long a context it claims (building one near 10**15 characters would take the server's
    memory and, on its event loop, every other request's time)."""
    key = api.collector()
    fp = register_fingerprint(api, key, engine)
    record = _record(api, key, fp)
    worker = _register(api, key, fp, _fake(fakes, key, record).url)
    response = api.client().post(
        "/v1/certifications", json={"pool": worker["pool"], "prompts": 3, "max_tokens": [4]}
    )
    assert response.status_code == 202, response.text
    chars = response.json()["parameters"]["prompt_chars"]
    assert 8 <= chars <= MAX_PROMPT_CHARS
    assert api.client().get("/healthz").status_code == 200
    # the pool is being certified: a second job waits for this one
    again = api.client().post("/v1/certifications", json={"pool": worker["pool"], "prompts": 1})
    _error(again, 409, "certification_running")
    assert again.json()["error"]["details"] == {
        "certification_id": response.json()["certification_id"]
    }


def test_a_running_certification_can_be_cancelled_which_frees_its_pool(
    api: Harness, fakes: list[FakeWorker]
) -> None:
    """The replay token that started a job whose worker holds its first probe cancels it
    (not a reader, nor another replay token): the job fails as ``cancelled`` and the pool
    takes another certification at once. An admin token cancels any job."""
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    release = threading.Event()

    def held(order: dict[str, Any]) -> Response:
        release.wait(30)
        return JSONResponse({"error": {"code": "x", "message": "released"}}, 503)

    try:
        worker = _register(api, key, fp, _fake(fakes, key, {}, respond=held).url)
        replay = api.client(api.token("replay"))
        started = replay.post("/v1/certifications", json={"pool": worker["pool"]})
        assert started.status_code == 202, started.text
        job = started.json()["certification_id"]
        reader = api.client(api.token("records:read"))
        _error(reader.post(f"/v1/certifications/{job}/cancel"), 403, "insufficient_scope")
        another = api.client(api.token("replay"))
        _error(another.post(f"/v1/certifications/{job}/cancel"), 403, "not_job_starter")
        assert api.client().get(f"/v1/certifications/{job}").json()["status"] == "running"
        cancelled = replay.post(f"/v1/certifications/{job}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "failed"
        assert cancelled.json()["error"]["code"] == "cancelled"
        assert api.client().get(f"/v1/certifications/{job}").json() == cancelled.json()
        _error(replay.post(f"/v1/certifications/{job}/cancel"), 409, "job_finished")
        _error(replay.post("/v1/certifications/cert-x/cancel"), 422, "invalid_parameters")
        unknown = replay.post("/v1/certifications/cert-" + "0" * 32 + "/cancel")
        _error(unknown, 404, "job_not_found")
        after = another.post("/v1/certifications", json={"pool": worker["pool"]})
        assert after.status_code == 202, after.text
        assert (
            api.client()
            .post(  # an admin's
                f"/v1/certifications/{after.json()['certification_id']}/cancel"
            )
            .is_success
        )
    finally:
        release.set()


def test_a_certification_sends_a_bounded_number_of_probes(
    api: Harness, fakes: list[FakeWorker]
) -> None:
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    worker = _register(api, key, fp, _fake(fakes, key, _record(api, key, fp)).url)
    wide = {"pool": worker["pool"], "prompts": 256, "concurrency": [2, 3, 5, 7, 11, 13, 17, 19]}
    response = api.client().post("/v1/certifications", json={**wide, "max_tokens": [1, 2, 3, 4]})
    _error(response, 422, "invalid_parameters")
    details = response.json()["error"]["details"]
    assert details == {"probes": 10_428, "max_probes": MAX_PROBES}
    # nothing was started: a certification within the bound is accepted
    small = {**wide, "prompts": 1, "max_tokens": [1]}
    accepted = api.client().post("/v1/certifications", json=small)
    assert accepted.status_code == 202 and accepted.json()["total"] == 79


def test_an_edited_worker_row_is_not_trusted(api: Harness, fakes: list[FakeWorker]) -> None:
    """A database superuser points the victim's worker at a fake signing with its own key."""
    victim, attacker = api.collector(), api.collector()
    fp = register_fingerprint(api, victim, serial_engine())
    record = _record(api, victim, fp)
    honest = _fake(fakes, victim, record)
    worker = _register(api, victim, fp, honest.url)
    impostor = _fake(fakes, attacker, record)
    for change in ({"url": impostor.url}, {"url": impostor.url, "key_id": attacker.key_id}):
        with api.db.write() as s:
            s.execute(
                update(Worker).where(Worker.worker_id == worker["worker_id"]).values(**change)
            )
        listed = _worker(api, worker["worker_id"])
        assert not listed["live"] and listed["problem"]
        response = api.client().post(
            "/v1/replays", json={"request_id": record["request_id"], "pool": worker["pool"]}
        )
        _error(response, 409, "no_matching_pool")
    assert impostor.orders == []


def test_edited_worker_times_neither_revive_a_worker_nor_lock_it_out(api: Harness) -> None:
    """A superuser makes a dead worker live (its row's times moved on), or rolls its row back
    to an older heartbeat it really signed: the route trusts only the signed time, and the
    worker's next heartbeat is taken."""
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    ids = {"worker_id": _name("w"), "pool": _name("pool"), "fingerprint_id": fp}
    now = datetime.now(UTC)
    assert post_heartbeat(api, heartbeat(key, **ids, url="http://127.0.0.1:8")).status_code == 200
    # a heartbeat the worker signed long ago (captured then, or kept by the database)
    at = now - timedelta(seconds=100)
    old = heartbeat(key, **ids, url="http://127.0.0.1:7", issued_at=at)
    rolled_back = {"heartbeat": old.canonical, "url": "http://127.0.0.1:7"}
    later = datetime(2036, 1, 1, tzinfo=UTC)
    for change in (
        {"last_seen": later, "heartbeat_issued_at": later},  # revived, far ahead
        {"last_seen": later},
        {**rolled_back, "heartbeat_issued_at": at, "last_seen": now},  # seen now: it was not
        {**rolled_back, "heartbeat_issued_at": at, "last_seen": at},  # as the ledger took it
    ):
        with api.db.write() as s:
            s.execute(update(Worker).where(Worker.worker_id == ids["worker_id"]).values(**change))
        listed = _worker(api, ids["worker_id"])
        assert not listed["live"], (change, listed)
    # and the worker's next heartbeat is taken, whatever the row's times say
    newer = heartbeat(key, **ids, url="http://127.0.0.1:8", issued_at=now + timedelta(seconds=1))
    answer = post_heartbeat(api, newer)
    assert answer.status_code == 200, answer.text
    assert answer.json()["url"] == "http://127.0.0.1:8" and answer.json()["live"]


def test_a_heartbeat_nobody_registered_signed_is_refused_before_its_url_is_looked_at(
    api: Harness,
) -> None:
    """Otherwise any records:write holder learns from the ledger whether a name resolves, and
    to which address (url_not_allowed names it)."""
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    stranger = SigningKey.generate()
    for url in ("http://169.254.169.254/", "http://no-such-host.invalid:8100"):
        ids = {"worker_id": _name("w"), "pool": _name("p"), "fingerprint_id": fp}
        _error(post_heartbeat(api, heartbeat(stranger, **ids, url=url)), 422, "unknown_key")
        tampered = heartbeat(key, **ids, url="http://127.0.0.1:9").to_dict()
        tampered["body"]["url"] = url
        _error(post_heartbeat(api, tampered), 422, "bad_signature")


# ---- worker URL policy -------------------------------------------------------------------

REFUSED_URLS = [
    "http://169.254.169.254/latest/meta-data/",  # link-local: the cloud metadata address
    "http://169.254.1.1:8100",
    "http://[fe80::1]:8100",
    "http://[fe80::1%25eth0]:8100",
    "http://[fd00:ec2::254]/",  # AWS metadata over IPv6
    "http://100.100.100.200/",  # Alibaba Cloud metadata
    "http://[::ffff:169.254.169.254]/",  # IPv4-mapped
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of 169.254.169.254
    "http://2852039166/",  # a host name that resolves to 169.254.169.254
    "http://0.0.0.0:8100",  # unspecified
    "http://[::]:8100",
    "http://224.0.0.1/",  # multicast
    "http://[ff02::1]/",
    "http://255.255.255.255/",  # broadcast
]
INVALID_URLS = [
    "http://[::1",  # was a 500
    "http://[::1]x/",
    "http://user:secret@127.0.0.1:8100",
    "http://@127.0.0.1:8100",
    "ftp://127.0.0.1/",
    "file:///etc/passwd",
    "gopher://127.0.0.1:70/",
    "127.0.0.1:8100",
    "http://",
    "http:///path",
    "http://127.0.0.1:99999/",
    "http://127.0.0.1:port/",
    "http://127.0.0.1:8100/?next=http://169.254.169.254",
    "http://127.0.0.1:8100/#x",
    "http://127.0.0.1:8100/\u00e9",
    "http://127.0.0.1:8100/a b",
    "http://127.0.0.1:8100/" + "a" * 500,
    "http://no-such-host.invalid:8100",
]


def _url_answer(api: Harness, key: SigningKey, fp: str, url: str) -> Any:
    return post_heartbeat(
        api, heartbeat(key, worker_id=_name("w"), pool=_name("p"), url=url, fingerprint_id=fp)
    )


def test_worker_urls_follow_the_policy(api: Harness) -> None:
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    for url in REFUSED_URLS:
        _error(_url_answer(api, key, fp, url), 422, "url_not_allowed")
    for url in INVALID_URLS:
        _error(_url_answer(api, key, fp, url), 422, "invalid_url")
    for url in ("http://127.0.0.1:8100", "https://localhost:8443/prefix/", "http://[::1]:8100"):
        assert _url_answer(api, key, fp, url).status_code == 200, url


def test_worker_networks_setting(api: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    monkeypatch.setattr(api.settings, "worker_networks", "10.0.0.0/8")
    for url in ("http://127.0.0.1:8100", "http://localhost:8100"):  # outside the networks
        _error(_url_answer(api, key, fp, url), 422, "url_not_allowed")
    # everything listed still does not allow metadata; listing it explicitly does
    monkeypatch.setattr(api.settings, "worker_networks", "0.0.0.0/0,::/0")
    _error(_url_answer(api, key, fp, "http://169.254.169.254/"), 422, "url_not_allowed")
    assert _url_answer(api, key, fp, "http://127.0.0.1:8100").status_code == 200
    monkeypatch.setattr(api.settings, "worker_networks", "169.254.169.254/32")
    assert _url_answer(api, key, fp, "http://169.254.169.254/").status_code == 200
    _error(_url_answer(api, key, fp, "http://169.254.169.253/"), 422, "url_not_allowed")


def test_addresses_are_checked_again_when_an_order_is_sent(
    api: Harness, fakes: list[FakeWorker], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    record = _record(api, key, fp)
    fake = _fake(fakes, key, record)
    url = fake.url.replace("127.0.0.1", "localhost")  # a name, resolved at each connection
    worker = _register(api, key, fp, url)
    monkeypatch.setattr(api.settings, "worker_networks", "10.0.0.0/8")
    verdict = _replay(api, record["request_id"], worker["pool"])
    assert verdict["verdict"] == "error" and "url_not_allowed" in verdict["reason"]
    assert fake.orders == []
    monkeypatch.setattr(api.settings, "worker_networks", "")
    assert _replay(api, record["request_id"], worker["pool"])["verdict"] == "bitwise"
    assert len(fake.orders) == 1


# ---- what a worker answers: bounded in time and size, its words kept out of the log --------


def _trickle(_: dict[str, Any]) -> Response:
    async def one_byte_at_a_time() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b" "  # JSON whitespace: every read gets a byte, none waits a whole timeout
            await asyncio.sleep(0.25)
        yield b"{}"

    return StreamingResponse(one_byte_at_a_time(), media_type="application/json")


@pytest.mark.parametrize(
    ("respond", "says"),
    [
        (_trickle, "did not answer within 1 s"),
        (lambda _: Response(b" " * 200_000, media_type="application/json"), "more than"),
    ],
    ids=["trickled", "flooded"],
)
def test_a_worker_that_trickles_or_floods_its_answer_is_cut_off(
    api: Harness,
    fakes: list[FakeWorker],
    monkeypatch: pytest.MonkeyPatch,
    respond: Callable[[dict[str, Any]], Response],
    says: str,
) -> None:
    """LEDGER_REPLAY_TIMEOUT bounds the whole answer, not each read, and the answer is read up
    to the body limit only: a compromised collector cannot hold a replay (or a certification
    probe) open, nor fill the ledger's memory."""
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    record = _record(api, key, fp)
    fake = _fake(fakes, key, record, respond=respond)
    worker = _register(api, key, fp, fake.url)
    monkeypatch.setattr(api.settings, "replay_timeout", 1.0)
    monkeypatch.setattr(api.settings, "max_body_bytes", 100_000)
    started = time.monotonic()
    verdict = _replay(api, record["request_id"], worker["pool"])
    assert time.monotonic() - started < 5  # the trickle alone lasts 10 s
    assert verdict["verdict"] == "error" and says in verdict["reason"], verdict["reason"]


def test_a_workers_error_message_is_not_written_into_the_signed_verdict(
    api: Harness, fakes: list[FakeWorker]
) -> None:
    """An engine's error may quote the request (its prompt): a verdict is a leaf no erasure
    removes, so it names the worker's status and error code, never its message."""
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    record = _record(api, key, fp)
    refusal = {"error": {"code": "invalid_request", "message": "prompt 'MY SECRET' too long"}}
    fake = _fake(fakes, key, record, respond=lambda _: JSONResponse(refusal, status_code=400))
    worker = _register(api, key, fp, fake.url)
    verdict = _replay(api, record["request_id"], worker["pool"])
    assert verdict["verdict"] == "error"
    assert "HTTP 400, code invalid_request" in verdict["reason"], verdict["reason"]
    assert "SECRET" not in json.dumps(verdict)


SECRET = "MY SECRET PROMPT 078-05-1120"


def _signed_as(key: SigningKey, kind: str) -> Callable[[dict[str, Any]], Response]:
    def respond(_: dict[str, Any]) -> Response:
        return Response(sign_envelope(kind, {"x": 1}, key).canonical, media_type="application/json")

    return respond


@pytest.mark.parametrize(
    ("how", "code"),
    [
        ("kind", "wrong_kind"),
        ("member", "invalid_replay_document"),
        ("worker_id", "wrong_order"),
        ("schema_version", "invalid_replay_document"),
        ("envelope", "schema_violation"),
    ],
)
def test_what_a_worker_writes_in_its_answer_never_reaches_the_signed_verdict(
    api: Harness, fakes: list[FakeWorker], how: str, code: str
) -> None:
    """A compromised worker may put anything in its answer (a prompt it saw in the order, say):
    the verdict is a signed leaf no erasure removes, so its reason is in the ledger's words
    and names the check that refused the answer, never what the answer held."""
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    record = _record(api, key, fp)
    kw: dict[str, Any] = {}
    if how == "kind":
        kw["respond"] = _signed_as(key, SECRET)
    elif how == "envelope":
        kw["respond"] = lambda _: JSONResponse({"kind": "k", "body": {}, SECRET: 1})
    else:
        edits = {
            "member": {SECRET: 1},
            "worker_id": {"worker_id": SECRET},
            "schema_version": {"schema_version": SECRET},
        }
        kw["tamper"] = lambda output: output.update(edits[how])
    worker = _register(api, key, fp, _fake(fakes, key, record, **kw).url)
    verdict = _replay(api, record["request_id"], worker["pool"])
    assert verdict["verdict"] == "error" and verdict["reason"].startswith(f"{code}: "), verdict
    assert "SECRET" not in json.dumps(verdict)
    assert "SECRET" not in api.client().get(f"/v1/replays/{verdict['replay_id']}").text


@pytest.mark.parametrize("bad", [{"x": 1}, 12, "not-a-fingerprint"])
def test_an_output_naming_a_malformed_fingerprint_is_an_error_verdict_not_a_500(
    api: Harness, fakes: list[FakeWorker], bad: object
) -> None:
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    record = _record(api, key, fp)
    fake = _fake(fakes, key, record, tamper=lambda output: output.update(fingerprint_id=bad))
    worker = _register(api, key, fp, fake.url)
    verdict = _replay(api, record["request_id"], worker["pool"])  # asserts 201
    assert verdict["verdict"] == "error", verdict
    assert verdict["reason"].startswith("invalid_replay_document: "), verdict
    listed = api.client().get(f"/v1/records/{record['request_id']}").json()["replays"]
    assert verdict["replay_id"] in [item["replay_id"] for item in listed]


# ---- batch invariance is derived, never claimed ------------------------------------------

SERIAL = serial_engine()


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        (None, "none"),  # no engine section
        ({"name": "test"}, "none"),
        (SERIAL, "serial"),
        (
            {"name": "vllm", "env": {"VLLM_BATCH_INVARIANT": "1"}, "batch_invariance": "kernel"},
            "kernel",
        ),
        # the section's batch_invariance is the collector's claim: the ledger derives its own
        ({"name": "vllm", "batch_invariance": "serial"}, "none"),
        ({"name": "vllm", "batch_invariance": "kernel"}, "none"),
        ({**SERIAL, "max_num_seqs": 256}, "none"),
        ({**SERIAL, "enable_prefix_caching": True}, "none"),
        ({**SERIAL, "max_num_seqs": True}, "none"),  # true is not 1
        ({**SERIAL, "batch_invariance": "none"}, "serial"),
        ({"name": "vllm", "env": {"VLLM_BATCH_INVARIANT": "0"}}, "none"),
        ({"name": "vllm", "env": {"VLLM_BATCH_INVARIANT": 1}}, "none"),  # vLLM reads strings
        ({"name": "vllm", "env": "VLLM_BATCH_INVARIANT=1"}, "none"),
        ({"name": "vllm", "batch_invariance": "yes, trust me"}, "none"),
        ({"name": "vllm", "batch_invariance": True}, "none"),
    ],
)
def test_batch_invariance_comes_from_the_fingerprint(
    api: Harness, engine: dict[str, Any] | None, expected: str
) -> None:
    key = api.collector()
    fp = register_fingerprint(api, key, engine)
    pool = _name("pool")
    claimed = heartbeat(
        key, worker_id=_name("w"), pool=pool, url="http://127.0.0.1:9", fingerprint_id=fp,
        batch_invariance="serial",
    )  # fmt: skip
    _error(post_heartbeat(api, claimed), 422, "schema_violation")
    worker = _register(api, key, fp, "http://127.0.0.1:9", pool=pool)
    assert worker["batch_invariance"] == expected
    assert api.client().get(f"/v1/pools/{pool}").json()["batch_invariance"] == [expected]
    if expected == "none":
        request_id = _record(api, key, fp)["request_id"]
        response = api.client().post("/v1/replays", json={"request_id": request_id})
        _error(response, 409, "no_matching_pool")
        nearest = response.json()["error"]["details"]["nearest_pools"]
        assert next(p for p in nearest if p["pool"] == pool)["batch_invariance"] == "none"


def test_a_forced_replay_on_a_fingerprint_without_invariance_is_not_comparable(
    api: Harness, fakes: list[FakeWorker]
) -> None:
    key = api.collector()
    fp = register_fingerprint(api, key, None)
    record = _record(api, key, fp)
    worker = _register(api, key, fp, _fake(fakes, key, record).url)
    response = api.client().post(
        "/v1/replays",
        json={"request_id": record["request_id"], "pool": worker["pool"], "force": True},
    )
    verdict = response.json()["envelope"]["body"]
    assert verdict["verdict"] == "not_comparable" and "not batch-invariant" in verdict["reason"]
    assert verdict["comparison"]["verdict"] == "bitwise"
    assert verdict["worker_key_id"] == key.key_id


def test_a_listed_worker_is_checked_again_each_read(api: Harness) -> None:
    """Each stored heartbeat's signature is checked once per process; the registry's checks
    and the row's agreement with it, on every read: a key revoked after a listing, or a
    heartbeat rewritten in the row, makes the worker not live at the next one."""
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    worker = _register(api, key, fp, "http://127.0.0.1:9")
    wid = worker["worker_id"]
    assert _worker(api, wid)["live"] and _worker(api, wid)["live"]  # verified, then remembered
    with api.db.read() as s:
        stored = json.loads(s.get_one(Worker, wid).heartbeat)
    forged = {**stored, "body": {**stored["body"], "url": "http://127.0.0.1:7"}}
    with api.db.write() as s:
        s.execute(
            update(Worker)
            .where(Worker.worker_id == wid)
            .values(heartbeat=json.dumps(forged).encode(), url="http://127.0.0.1:7")
        )
    listed = _worker(api, wid)
    assert not listed["live"] and "signature" in listed["problem"], listed
    with api.db.write() as s:
        s.execute(
            update(Worker)
            .where(Worker.worker_id == wid)
            .values(heartbeat=json.dumps(stored).encode(), url="http://127.0.0.1:9")
        )
    assert _worker(api, wid)["live"]
    revoked = api.client().post(f"/v1/keys/{key.key_id}/revoke", json={"reason": "stolen"})
    assert revoked.status_code == 200, revoked.text
    listed = _worker(api, wid)
    assert not listed["live"] and "revoked_key" in listed["problem"], listed


def test_a_key_holds_a_bounded_number_of_worker_ids(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compromised collector registering worker IDs without end would make every listing,
    pool lookup and metrics scrape slower: a key holds at most LEDGER_MAX_WORKERS_PER_KEY,
    and those unseen for a day make room."""
    monkeypatch.setattr(api.settings, "max_workers_per_key", 3)
    key, other = api.collector(), api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    pool = _name("pool")
    held = [_register(api, key, fp, "http://127.0.0.1:9", pool=pool)["worker_id"] for _ in range(3)]
    refused = post_heartbeat(
        api,
        heartbeat(
            key, worker_id=_name("w"), pool=pool, url="http://127.0.0.1:9", fingerprint_id=fp
        ),
    )
    _error(refused, 409, "too_many_workers")
    assert refused.json()["error"]["details"] == {"key_id": key.key_id, "limit": 3}
    # its own IDs still heartbeat, and another key is not held back
    _register(api, key, fp, "http://127.0.0.1:9", pool=pool, worker_id=held[0])
    _register(api, other, register_fingerprint(api, other, serial_engine()), "http://127.0.0.1:9")
    # a worker unseen for longer than FORGET_AFTER is forgotten when the key needs room
    with api.db.write() as s:
        s.execute(
            update(Worker)
            .where(Worker.worker_id == held[1])
            .values(last_seen=datetime.now(UTC) - timedelta(days=2))
        )
    _register(api, key, fp, "http://127.0.0.1:9", pool=pool)
    listed = {w["worker_id"] for w in api.client().get("/v1/workers").json()["items"]}
    assert held[1] not in listed and {held[0], held[2]} <= listed
