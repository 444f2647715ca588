"""The shipper against a real ledger: batches acknowledged, a refused record set aside."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from collectors.ledger_client import LedgerClient
from collectors.shipper import MAX_BYTES, Shipper
from collectors.spool import Spool
from ledger.fingerprint import fingerprint_id
from ledger.signing import Envelope
from tests.support.documents import fingerprint_envelope
from tests.support.harness import MAX_BATCH, MAX_BODY, Harness


def test_a_conflicting_record_goes_to_dead_letters_and_the_rest_ships(api: Harness, tmp_path: Path):
    key, fp_id = api.setup_collector()
    held = api.record(key, fp_id)
    assert api.post([held]).status_code == 201
    conflicting = api.record(key, fp_id, request_id=held.body["request_id"], seed=99)
    good = [api.record(key, fp_id) for _ in range(3)]
    spool = Spool(tmp_path / "spool.sqlite")
    spool.put(good[0].body["request_id"], good[0].canonical)
    spool.put("conflict", conflicting.canonical)
    for env in good[1:]:
        spool.put(env.body["request_id"], env.canonical)
    shipped: list[int] = []
    failures: list[str] = []
    client = LedgerClient(api.url, api.token("records:write"))
    shipper = Shipper(spool, client, on_shipped=shipped.append, on_failure=failures.append)
    shipper.start()
    deadline = time.monotonic() + 30
    while spool.pending() and time.monotonic() < deadline:
        time.sleep(0.05)
    shipper.stop()
    assert spool.pending() == 0 and spool.dead_letters() == 1
    assert sum(shipped) == 3 and failures == ["record_conflict"]
    for env in good:
        assert api.client().get(f"/v1/records/{env.body['request_id']}").status_code == 200
    spool.close()
    client.close()


def _ship_all(spool: Spool, shipper: Shipper, timeout: float = 60) -> None:
    shipper.start()
    deadline = time.monotonic() + timeout
    while spool.pending() and time.monotonic() < deadline:
        time.sleep(0.05)
    shipper.stop()


def _held(api: Harness, envs: list[Envelope]) -> list[int]:
    return [api.client().get(f"/v1/records/{e.body['request_id']}").status_code for e in envs]


def test_batches_keep_under_the_ledgers_body_limit(api: Harness, tmp_path: Path):
    # Records of ~0.56 MB: the first batch (all seven, ~5.6 MB) is over the harness's 2 MiB
    # body limit. The shipper learns the limit from the ledger's answer and sends what fits;
    # the one record of ~2.2 MB can never get in and is set aside, not retried forever.
    key, fp_id = api.setup_collector()
    large = [api.record(key, fp_id, prompt_len=50_000) for _ in range(4)]
    alone_too_large = api.record(key, fp_id, prompt_len=200_000)
    small = [api.record(key, fp_id) for _ in range(2)]
    spool = Spool(tmp_path / "spool.sqlite")
    for env in [*large[:2], alone_too_large, *large[2:], *small]:
        spool.put(env.body["request_id"], env.canonical)
    shipped: list[int] = []
    failures: list[str] = []
    client = LedgerClient(api.url, api.token("records:write"))
    shipper = Shipper(spool, client, on_shipped=shipped.append, on_failure=failures.append)
    _ship_all(spool, shipper)
    assert spool.pending() == 0 and spool.dead_letters() == 1
    assert shipped == [2, 4] and failures == ["body_too_large"]
    assert shipper.max_bytes < MAX_BODY
    assert _held(api, [*large, *small]) == [200] * 6
    assert _held(api, [alone_too_large]) == [404]
    with sqlite3.connect(tmp_path / "spool.sqlite") as db:
        ((request_id, reason),) = db.execute("SELECT request_id, reason FROM dead_letters")
    assert request_id == alone_too_large.body["request_id"] and "too_large" in reason
    spool.close()
    client.close()


def test_batches_are_capped_in_bytes(api: Harness, tmp_path: Path):
    key, fp_id = api.setup_collector()
    envs = [api.record(key, fp_id, prompt_len=50_000) for _ in range(5)]
    spool = Spool(tmp_path / "spool.sqlite")
    for env in envs:
        spool.put(env.body["request_id"], env.canonical)
    shipped: list[int] = []
    failures: list[str] = []
    client = LedgerClient(api.url, api.token("records:write"))
    cap = 2 * max(len(e.canonical) for e in envs) + 100  # two fit, three do not
    shipper = Shipper(
        spool, client, max_bytes=cap, on_shipped=shipped.append, on_failure=failures.append
    )
    _ship_all(spool, shipper)
    assert shipped == [2, 2, 1] and failures == []
    assert _held(api, envs) == [200] * 5
    spool.close()
    client.close()


def test_a_record_under_a_fingerprint_the_ledger_lacks_waits_for_it(api: Harness, tmp_path: Path):
    # The engine restarted as a batch formed: the new fingerprint was queued after the
    # shipper's registration pass, and the batch names it. The ledger refuses the batch
    # (unknown_fingerprint); the record must wait for the fingerprint, not be set aside.
    key, _ = api.setup_collector()
    fp = fingerprint_envelope(key)
    fp_id = fingerprint_id(fp.body)
    env = api.record(key, fp_id)
    spool = Spool(tmp_path / "spool.sqlite")
    spool.add_fingerprint(fp_id, fp.canonical)
    spool.fingerprint_registered(fp_id)  # as the shipper saw it: nothing left to register
    spool.put(env.body["request_id"], env.canonical)
    shipped: list[int] = []
    failures: list[str] = []
    client = LedgerClient(api.url, api.token("records:write"))
    shipper = Shipper(spool, client, on_shipped=shipped.append, on_failure=failures.append)
    _ship_all(spool, shipper)
    assert spool.pending() == 0 and spool.dead_letters() == 0
    assert shipped == [1] and failures == ["unknown_fingerprint"]
    assert api.client().get(f"/v1/fingerprints/{fp_id}").status_code == 200
    assert _held(api, [env]) == [200]
    spool.close()
    client.close()


def test_a_batch_over_the_ledgers_record_limit_is_cut_to_it(api: Harness, tmp_path: Path):
    # The ledger takes at most MAX_BATCH records per batch; its 413 names that count, which is
    # not a byte limit.
    key, fp_id = api.setup_collector()
    envs = [api.record(key, fp_id) for _ in range(MAX_BATCH + 10)]
    spool = Spool(tmp_path / "spool.sqlite")
    for env in envs:
        spool.put(env.body["request_id"], env.canonical)
    shipped: list[int] = []
    failures: list[str] = []
    client = LedgerClient(api.url, api.token("records:write"))
    shipper = Shipper(spool, client, on_shipped=shipped.append, on_failure=failures.append)
    _ship_all(spool, shipper)
    assert shipped == [MAX_BATCH, 10] and failures == []
    assert shipper.batch == MAX_BATCH and shipper.max_bytes == MAX_BYTES
    spool.close()
    client.close()


def test_a_record_under_a_fingerprint_this_collector_never_had_is_set_aside(
    api: Harness, tmp_path: Path
):
    key, fp_id = api.setup_collector()
    stray = api.record(key, "sha256:" + "1" * 64)
    good = api.record(key, fp_id)
    spool = Spool(tmp_path / "spool.sqlite")
    spool.put(stray.body["request_id"], stray.canonical)
    spool.put(good.body["request_id"], good.canonical)
    shipped: list[int] = []
    failures: list[str] = []
    client = LedgerClient(api.url, api.token("records:write"))
    shipper = Shipper(spool, client, on_shipped=shipped.append, on_failure=failures.append)
    _ship_all(spool, shipper)
    assert spool.pending() == 0 and spool.dead_letters() == 1
    assert shipped == [1] and failures == ["unknown_fingerprint"]
    assert _held(api, [good, stray]) == [200, 404]
    spool.close()
    client.close()


class _FailsOnce(LedgerClient):
    """The real client, whose first batch fails with an error the shipper does not expect."""

    failed = False

    def post_canonical(self, envelopes: list[bytes]) -> dict[str, Any]:
        if not self.failed:
            self.failed = True
            raise ValueError("not JSON")
        return super().post_canonical(envelopes)


def test_the_shipper_outlives_an_unexpected_error(api: Harness, tmp_path: Path):
    key, fp_id = api.setup_collector()
    env = api.record(key, fp_id)
    spool = Spool(tmp_path / "spool.sqlite")
    spool.put(env.body["request_id"], env.canonical)
    shipped: list[int] = []
    failures: list[str] = []
    client = _FailsOnce(api.url, api.token("records:write"))
    shipper = Shipper(spool, client, on_shipped=shipped.append, on_failure=failures.append)
    _ship_all(spool, shipper)
    assert shipped == [1] and failures == ["shipper_error"]
    assert _held(api, [env]) == [200]
    spool.close()
    client.close()
