"""Collector keys scoped to pools (``ledger.key_scope``), through the API on SQLite and Postgres.

The attack this closes: a compromised collector key signs records and heartbeats that name
another pool, so its records are searched, exported and cached as that pool's, and its worker
joins that pool and answers its replays. With ``pools`` in the key's registration, a record
or heartbeat naming another pool is refused and nothing is written; the registration cannot be
widened afterwards; and a log that holds such a record anyway is caught by ``ledger audit``
(tests/ledger/test_key_scope_audit.py) and by ``ledger verify`` and verify.js
(tests/api/ui/test_verify_js.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from sqlalchemy import func, select

from ledger.signing import Envelope, SigningKey, public_key_pem
from ledger.storage.audit import audit
from ledger.storage.models import LogEntry
from ledger.storage.models import SigningKey as SigningKey_
from tests.api.test_read_paths import superuser
from tests.support.documents import fingerprint_envelope
from tests.support.harness import Harness
from tests.support.http import assert_error
from tests.support.workers import heartbeat, post_heartbeat, register_fingerprint, serial_engine


def _pool() -> str:
    return f"pool-{uuid.uuid4().hex[:8]}"


def _register(api: Harness, key: SigningKey, **extra: Any) -> Any:
    body = {
        "name": f"k-{key.key_id[8:16]}",
        "role": "collector",
        "public_key": public_key_pem(key.public_key),
        **extra,
    }
    return api.client().post("/v1/keys", json=body)


def _log_size(api: Harness) -> int:
    with api.db.read() as s:
        return int(s.execute(select(func.count()).select_from(LogEntry)).scalar_one())


def _leaf_body(api: Harness, idx: int) -> dict[str, Any]:
    with api.db.read() as s:
        data = s.execute(select(LogEntry.envelope).where(LogEntry.idx == idx)).scalar_one()
    body: dict[str, Any] = json.loads(bytes(data))["body"]
    return body


def test_a_scoped_key_is_registered_with_its_pools_and_cannot_be_widened(api: Harness) -> None:
    key = SigningKey.generate()
    first, second = sorted([_pool(), _pool()])
    created = _register(api, key, pools=[second, first])
    assert created.status_code == 201, created.text
    assert created.json()["pools"] == [first, second]  # sorted, as the leaf holds them
    assert _leaf_body(api, created.json()["log_index"])["pools"] == [first, second]
    assert api.client().get(f"/v1/keys/{key.key_id}").json()["pools"] == [first, second]
    # the same registration again is a no-op; a wider, narrower or absent scope is a conflict
    assert _register(api, key, pools=[first, second]).status_code == 200
    for pools in ([first], [first, second, _pool()], None):
        assert_error(_register(api, key, pools=pools), 409, "key_conflict")
    # an unscoped key says so, and its registration holds no pools member
    other = SigningKey.generate()
    unscoped = _register(api, other)
    assert unscoped.status_code == 201 and unscoped.json()["pools"] is None
    assert "pools" not in _leaf_body(api, unscoped.json()["log_index"])


@pytest.mark.parametrize(
    "pools",
    [[], ["bad name"], ["a", "a"], ["x" * 101], [""], "pool-a", [1], [None], ["p"] * 65],
    ids=["empty", "space", "twice", "long", "blank", "text", "number", "null", "too-many"],
)
def test_a_malformed_scope_is_refused_and_nothing_is_logged(api: Harness, pools: Any) -> None:
    before = _log_size(api)
    response = _register(api, SigningKey.generate(), pools=pools)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] in ("invalid_pools", "schema_violation")
    assert _log_size(api) == before


def test_a_replayer_key_takes_no_pools(api: Harness) -> None:
    key = SigningKey.generate()
    body = {
        "name": "r",
        "role": "replayer",
        "public_key": public_key_pem(key.public_key),
        "pools": [_pool()],
    }
    assert_error(api.client().post("/v1/keys", json=body), 422, "invalid_pools")


def test_a_record_for_another_pool_is_refused_and_the_batch_is_not_written(api: Harness) -> None:
    mine, theirs = _pool(), _pool()
    key = api.collector(pools=[mine])
    fp = api.fingerprint(key)
    ok = api.record(key, fp, pool=mine)
    stray = api.record(key, fp, pool=theirs)
    before = _log_size(api)
    response = api.post([ok, stray])
    assert_error(response, 422, "key_out_of_scope")
    error = response.json()["error"]
    assert error["details"]["item"] == 1 and error["details"]["pools"] == [mine]
    assert theirs in error["message"] and mine in error["message"]
    assert _log_size(api) == before
    for env in (ok, stray):
        assert api.client().get(f"/v1/records/{env.body['request_id']}").status_code == 404
    # its own pool is accepted, and found under that pool only
    assert api.post([ok]).status_code == 201
    found = api.client().get("/v1/records", params={"pool": theirs}).json()["items"]
    assert found == []


def test_a_heartbeat_for_another_pool_registers_no_worker(api: Harness) -> None:
    mine, theirs = _pool(), _pool()
    key = api.collector(pools=[mine])
    fp = register_fingerprint(api, key, serial_engine())
    worker_id = f"w-{uuid.uuid4().hex[:8]}"
    beat = heartbeat(
        key, worker_id=worker_id, pool=theirs, url="http://127.0.0.1:9", fingerprint_id=fp
    )
    assert_error(post_heartbeat(api, beat), 422, "key_out_of_scope")
    workers = api.client().get("/v1/workers").json()["items"]
    assert worker_id not in {w["worker_id"] for w in workers}
    assert api.client().get(f"/v1/pools/{theirs}").status_code == 404
    # the same worker in its own pool registers
    beat = heartbeat(
        key, worker_id=worker_id, pool=mine, url="http://127.0.0.1:9", fingerprint_id=fp
    )
    response = post_heartbeat(api, beat)
    assert response.status_code == 200, response.text
    assert response.json()["pool"] == mine


def test_an_unscoped_key_still_signs_for_any_pool(api: Harness) -> None:
    key, fp = api.setup_collector()
    envs = [api.record(key, fp, pool=_pool()) for _ in range(2)]
    assert api.post(envs).status_code == 201


def test_a_key_row_pointed_at_another_leaf_signs_nothing(api: Harness) -> None:
    """A superuser points a scoped key's ``signing_keys.log_index`` at a leaf that is not its
    registration (one without ``pools``): the ledger reads role and scope from that leaf, so
    the key signs nothing at all, for no pool, never for any pool; the audit names the row."""
    mine = _pool()
    key = api.collector(pools=[mine])
    created = api.client().post("/v1/fingerprints", content=fingerprint_envelope(key).canonical)
    assert created.status_code == 201, created.text
    fp, leaf = created.json()["fingerprint_id"], created.json()["log_index"]
    with api.db.read() as s:
        registered = s.execute(
            select(SigningKey_.log_index).where(SigningKey_.key_id == key.key_id)
        ).scalar_one()
    edit = "UPDATE signing_keys SET log_index = :i WHERE key_id = :k"
    superuser(api, ("signing_keys",), (edit, {"i": leaf, "k": key.key_id}))
    try:
        for pool in (mine, _pool()):
            response = api.post([api.record(key, fp, pool=pool)])
            assert_error(response, 422, "key_role_not_allowed")
            assert "does not verify" in response.json()["error"]["message"]
        shown = api.client().get(f"/v1/keys/{key.key_id}").json()
        assert (shown["role"], shown["pools"]) == ("unverified", [])
        findings = audit(api.db, api.log_key.public_key).findings
        assert any(
            f.table == "signing_keys" and f.column == "log_index" and key.key_id in f.message
            for f in findings
        ), findings
    finally:
        superuser(api, ("signing_keys",), (edit, {"i": registered, "k": key.key_id}))
    # the row restored, the key signs again for its pool (no refusal is kept)
    assert api.post([api.record(key, fp, pool=mine)]).status_code == 201


def test_a_rewritten_registration_leaf_narrows_a_scope_never_widens_it(api: Harness) -> None:
    """A superuser rewrites a scoped key's registration leaf without its ``pools`` (the
    signature then fails): the ledger takes role and scope only from a leaf its own log key
    signed, so the key signs nothing until the leaf is restored; the audit names the leaf."""
    mine = _pool()
    key = api.collector(pools=[mine])
    fp = api.fingerprint(key)
    with api.db.read() as s:
        idx, data = s.execute(
            select(LogEntry.idx, LogEntry.envelope)
            .join(SigningKey_, SigningKey_.log_index == LogEntry.idx)
            .where(SigningKey_.key_id == key.key_id)
        ).one()
    original = bytes(data)
    leaf = json.loads(original)
    del leaf["body"]["pools"]
    widened = Envelope.from_dict(leaf).canonical
    edit = "UPDATE log_entries SET envelope = :e WHERE idx = :i"
    superuser(api, ("log_entries",), (edit, {"e": widened, "i": idx}))
    try:
        for pool in (_pool(), mine):
            response = api.post([api.record(key, fp, pool=pool)])
            assert_error(response, 422, "key_role_not_allowed")
        shown = api.client().get(f"/v1/keys/{key.key_id}").json()
        assert (shown["role"], shown["pools"]) == ("unverified", [])
        findings = audit(api.db, api.log_key.public_key).findings
        assert any(f.index == idx for f in findings), findings
    finally:
        superuser(api, ("log_entries",), (edit, {"e": original, "i": idx}))


def test_an_edited_role_column_gives_a_key_nothing_more_to_sign(api: Harness) -> None:
    """A superuser rewrites a replayer key's ``signing_keys.role`` to ``collector``: a
    replayer's registration names no pools, so the key would sign records and heartbeats for
    every pool. The ledger takes a key's role from its registration leaf, like its scope, so
    the key still signs only what a replayer signs; the audit names the column."""
    replayer = SigningKey.generate()
    registered = api.client().post(
        "/v1/keys",
        json={
            "name": f"r-{replayer.key_id[8:16]}",
            "role": "replayer",
            "public_key": public_key_pem(replayer.public_key),
        },
    )
    assert registered.status_code == 201, registered.text
    collector = api.collector(pools=[_pool()])
    fp = register_fingerprint(api, collector, serial_engine())
    edit = "UPDATE signing_keys SET role = :r WHERE key_id = :k"
    superuser(api, ("signing_keys",), (edit, {"r": "collector", "k": replayer.key_id}))
    try:
        record = api.post([api.record(replayer, fp, pool=_pool())])
        assert_error(record, 422, "key_role_not_allowed")
        beat = heartbeat(
            replayer,
            worker_id=f"w-{uuid.uuid4().hex[:8]}",
            pool=_pool(),
            url="http://127.0.0.1:9",
            fingerprint_id=fp,
        )
        assert_error(post_heartbeat(api, beat), 422, "key_role_not_allowed")
        assert api.client().get(f"/v1/keys/{replayer.key_id}").json()["role"] == "replayer"
        findings = audit(api.db, api.log_key.public_key).findings
        assert any(
            f.table == "signing_keys" and f.column == "role" and replayer.key_id in f.message
            for f in findings
        ), findings
    finally:
        superuser(api, ("signing_keys",), (edit, {"r": "replayer", "k": replayer.key_id}))


def test_a_replay_with_no_match_lists_every_pool_near_the_fingerprint(api: Harness) -> None:
    """A replay that names no pool is sent only to workers whose keys may sign for the
    record's pool, but the 409 ``no_matching_pool`` still lists the nearest pools among every
    live worker (names and differences, no request content), scoped keys or not."""
    from api.replayer import choose_worker
    from ledger.errors import Conflict

    pools = [_pool(), _pool()]
    keys = [api.collector(pools=[pool]) for pool in pools]
    # a fingerprint of this test alone, with no engine section: no worker qualifies, and the
    # two pools serving it are the nearest (no difference) whatever else is live
    fp = api.fingerprint(keys[0])
    for pool, key in zip(pools, keys, strict=True):
        beat = heartbeat(
            key,
            worker_id=f"w-{uuid.uuid4().hex[:8]}",
            pool=pool,
            url="http://127.0.0.1:9",
            fingerprint_id=fp,
        )
        assert post_heartbeat(api, beat).status_code == 200
    with pytest.raises(Conflict) as refused:
        choose_worker(api.db, 60.0, fp, None, False, pools[0])
    assert refused.value.code == "no_matching_pool"
    nearest = {p["pool"] for p in refused.value.details["nearest_pools"]}
    assert set(pools) <= nearest, nearest


def test_a_bundle_says_which_pools_its_collector_key_was_registered_for(
    api: Harness, tmp_path: Any
) -> None:
    """``ledger verify`` shows the signer's scope as the log key signed it: the pools of a
    scoped key, "any pool" for a key registered without them."""
    from ledger.evidence import verify_bundle
    from tests.support.cli import ledger

    mine = _pool()
    scoped, unscoped = api.collector(pools=[mine]), api.collector()
    shown = []
    for key, expected in ((scoped, [mine]), (unscoped, None)):
        fp = api.fingerprint(key)
        record = api.record(key, fp, pool=mine)
        assert api.post([record]).status_code == 201
        rid = record.body["request_id"]
        bundle = api.client().get(f"/v1/records/{rid}/evidence").json()
        verified = verify_bundle(bundle, api.log_key.public_key)
        assert verified.collector_pools == (tuple(expected) if expected else None)
        path = tmp_path / f"{rid}.json"
        path.write_text(json.dumps(bundle))
        pinned = tmp_path / "log.pub.pem"
        pinned.write_text(public_key_pem(api.log_key.public_key))
        out = ledger("verify", str(path), "--log-key", str(pinned), "--json")
        assert json.loads(out.stdout)["collector_key_pools"] == expected
        text = ledger("verify", str(path), "--log-key", str(pinned), env={"COLUMNS": "400"})
        shown.append(text.stdout)
    assert f"registered for pools {mine})" in shown[0], shown[0]
    assert "registered for any pool)" in shown[1], shown[1]
