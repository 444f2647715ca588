"""The shipper against a real ledger: batches acknowledged, a refused record set aside."""

from __future__ import annotations

import time
from pathlib import Path

from collectors.ledger_client import LedgerClient
from collectors.shipper import Shipper
from collectors.spool import Spool
from tests.support.harness import Harness


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
