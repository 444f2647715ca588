"""The shipper against a real ledger: batches acknowledged, a refused record set aside."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from client.ledger_client import LedgerClient
from collectors.shipper import MAX_BYTES, Shipper
from collectors.spool import Spool
from ledger.fingerprint import fingerprint_id
from ledger.signing import Envelope
from tests.support.documents import fingerprint_envelope
from tests.support.harness import MAX_BATCH, MAX_BODY, Harness


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    spool = Spool(tmp_path / "spool.sqlite")
    yield spool
    spool.close()


@dataclass(frozen=True)
class Shipped:
    shipper: Shipper
    batches: list[int]  # records per acknowledged batch
    failures: list[str]  # error codes, in order


def ship(
    api: Harness,
    spool: Spool,
    envs: list[Envelope],
    *,
    client_class: type[LedgerClient] = LedgerClient,
    deadline: float | None = None,
    **options: Any,
) -> Shipped:
    """Spool ``envs``, then run a shipper until the spool is empty (or 60 s passed)."""
    for env in envs:
        spool.put(env.body["request_id"], env.canonical)
    client = client_class(api.url, api.token("records:write"), deadline=deadline)
    batches: list[int] = []
    failures: list[str] = []
    shipper = Shipper(
        spool, client, on_shipped=batches.append, on_failure=failures.append, **options
    )
    shipper.start()
    deadline = time.monotonic() + 60
    while spool.pending() and time.monotonic() < deadline:
        time.sleep(0.05)
    shipper.stop()
    client.close()
    return Shipped(shipper, batches, failures)


def held(api: Harness, envs: list[Envelope]) -> list[int]:
    return [api.client().get(f"/v1/records/{e.body['request_id']}").status_code for e in envs]


def test_a_conflicting_record_goes_to_dead_letters_and_the_rest_ships(api: Harness, spool: Spool):
    key, fp_id = api.setup_collector()
    taken = api.record(key, fp_id)
    assert api.post([taken]).status_code == 201
    conflicting = api.record(key, fp_id, request_id=taken.body["request_id"], seed=99)
    good = [api.record(key, fp_id) for _ in range(3)]
    run = ship(api, spool, [good[0], conflicting, *good[1:]])
    assert spool.pending() == 0 and spool.dead_letters() == 1
    assert sum(run.batches) == 3 and run.failures == ["record_conflict"]
    assert held(api, good) == [200] * 3


def test_batches_keep_under_the_ledgers_body_limit(api: Harness, spool: Spool, tmp_path: Path):
    # Records of ~0.56 MB: the first batch (all seven, ~5.6 MB) is over the harness's 2 MiB
    # body limit. The shipper learns the limit from the ledger's answer and sends what fits;
    # the one record of ~2.2 MB can never get in and is set aside, not retried forever.
    key, fp_id = api.setup_collector()
    large = [api.record(key, fp_id, prompt_len=50_000) for _ in range(4)]
    alone_too_large = api.record(key, fp_id, prompt_len=200_000)
    small = [api.record(key, fp_id) for _ in range(2)]
    run = ship(api, spool, [*large[:2], alone_too_large, *large[2:], *small])
    assert spool.pending() == 0 and spool.dead_letters() == 1
    assert run.batches == [2, 4] and run.failures == ["body_too_large"]
    assert run.shipper.max_bytes < MAX_BODY
    assert held(api, [*large, *small, alone_too_large]) == [200] * 6 + [404]
    with sqlite3.connect(tmp_path / "spool.sqlite") as db:
        ((request_id, reason),) = db.execute("SELECT request_id, reason FROM dead_letters")
    db.close()
    assert request_id == alone_too_large.body["request_id"] and "too_large" in reason


def test_a_batch_over_the_ledgers_record_limit_is_cut_to_it(api: Harness, spool: Spool):
    # The ledger takes at most MAX_BATCH records per batch; its 413 names that count, which is
    # not a byte limit.
    key, fp_id = api.setup_collector()
    run = ship(api, spool, [api.record(key, fp_id) for _ in range(MAX_BATCH + 10)])
    assert run.batches == [MAX_BATCH, 10] and run.failures == []
    assert run.shipper.batch == MAX_BATCH and run.shipper.max_bytes == MAX_BYTES


def test_batches_are_capped_in_bytes(api: Harness, spool: Spool):
    key, fp_id = api.setup_collector()
    envs = [api.record(key, fp_id, prompt_len=50_000) for _ in range(5)]
    two = 2 * max(len(e.canonical) for e in envs) + 100  # two fit, three do not
    run = ship(api, spool, envs, max_bytes=two)
    assert run.batches == [2, 2, 1] and run.failures == []
    assert held(api, envs) == [200] * 5


def test_a_record_under_a_fingerprint_the_ledger_lacks_waits_for_it(api: Harness, spool: Spool):
    # The engine restarted as a batch formed: the new fingerprint was queued after the
    # shipper's registration pass, and the batch names it. The ledger refuses the batch
    # (unknown_fingerprint); the record must wait for the fingerprint, not be set aside.
    key, _ = api.setup_collector()
    fp = fingerprint_envelope(key)
    fp_id = fingerprint_id(fp.body)
    env = api.record(key, fp_id)
    spool.add_fingerprint(fp_id, fp.canonical)
    spool.fingerprint_registered(fp_id)  # as the shipper saw it: nothing left to register
    run = ship(api, spool, [env])
    assert spool.pending() == 0 and spool.dead_letters() == 0
    # a batch is shipped again when its answer came too late (a loaded host): at least once
    assert run.batches and set(run.batches) == {1}
    assert run.failures[0] == "unknown_fingerprint"
    assert "unknown_fingerprint" not in run.failures[1:]
    assert api.client().get(f"/v1/fingerprints/{fp_id}").status_code == 200
    assert held(api, [env]) == [200]


def test_a_record_under_a_fingerprint_this_collector_never_had_is_set_aside(
    api: Harness, spool: Spool
):
    key, fp_id = api.setup_collector()
    stray = api.record(key, "sha256:" + "1" * 64)
    good = api.record(key, fp_id)
    run = ship(api, spool, [stray, good])
    assert spool.pending() == 0 and spool.dead_letters() == 1
    assert run.batches == [1] and run.failures == ["unknown_fingerprint"]
    assert held(api, [good, stray]) == [200, 404]


class _FailsOnce(LedgerClient):
    """The real client, whose first batch fails with an error the shipper does not expect."""

    failed = False

    def post_canonical(self, envelopes: list[bytes]) -> dict[str, Any]:
        if not self.failed:
            self.failed = True
            raise ValueError("not JSON")
        return super().post_canonical(envelopes)


def test_the_shipper_outlives_an_unexpected_error(api: Harness, spool: Spool):
    key, fp_id = api.setup_collector()
    env = api.record(key, fp_id)
    run = ship(api, spool, [env], client_class=_FailsOnce)
    assert run.batches == [1] and run.failures == ["shipper_error"]
    assert held(api, [env]) == [200]


class _NarrowLink(LedgerClient):
    """The real client over a link that carries at most ``LIMIT`` bytes of a batch within the
    deadline: a larger batch fails as the deadline transport fails it, ledger_too_slow."""

    LIMIT = 3 * 1024

    def post_canonical(self, envelopes: list[bytes]) -> dict[str, Any]:
        from ledger.errors import Pushback

        if sum(map(len, envelopes)) > self.LIMIT:
            raise Pushback("the request's deadline passed", code="ledger_too_slow")
        return super().post_canonical(envelopes)


def test_a_link_too_slow_for_a_batch_within_the_deadline_gets_smaller_batches(
    api: Harness, spool: Spool
):
    """Resending the batch the deadline cut off would fail it for good: the shipper halves
    its batches at each ledger_too_slow until they get through, and every record is held."""
    key, fp_id = api.setup_collector()
    envs = [api.record(key, fp_id) for _ in range(12)]
    assert sum(len(e.canonical) for e in envs) > 4 * _NarrowLink.LIMIT
    run = ship(api, spool, envs, client_class=_NarrowLink, linger=0)
    assert spool.pending() == 0 and spool.dead_letters() == 0
    assert held(api, envs) == [200] * len(envs)
    assert run.failures and set(run.failures) == {"ledger_too_slow"}
    assert run.shipper.slow_cap is not None and run.shipper.slow_cap < _NarrowLink.LIMIT * 2
    assert sum(run.batches) == len(envs) and len(run.batches) > 1


def _fake_ledger(status: int, body: bytes, headers: dict[str, str] | None = None) -> Any:
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from demo.server_thread import ServerThread, free_port

    async def answer(_: Any) -> Response:
        return Response(body, status, headers=headers, media_type="application/json")

    routes = [Route("/v1/records", answer, methods=["POST"])]
    return ServerThread(Starlette(routes=routes), "127.0.0.1", free_port()).start()


@pytest.mark.parametrize(
    ("status", "body"),
    [(200, b'{"status": "ok"}'), (302, b"{}"), (201, b'{"results": []}')],
    ids=["ok-json", "redirect", "no-result-per-record"],
)
def test_an_answer_that_is_not_the_ledgers_acknowledges_nothing(
    api: Harness, spool: Spool, status: int, body: bytes
):
    """A proxy's 200 with its own JSON, a redirect, a batch answer without one result per
    record: the records stay in the spool (they were deleted as shipped before)."""
    key, fp_id = api.setup_collector()
    envs = [api.record(key, fp_id) for _ in range(3)]
    for env in envs:
        spool.put(env.body["request_id"], env.canonical)
    server = _fake_ledger(status, body)
    failures: list[str] = []
    client = LedgerClient(server.url, "t")
    shipper = Shipper(spool, client, on_failure=failures.append).start()
    try:
        deadline = time.monotonic() + 10
        while not failures and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        shipper.stop()
        client.close()
        server.stop()
    assert spool.pending() == 3 and spool.dead_letters() == 0
    assert failures and set(failures) == {"unexpected_answer"}, failures


def test_a_long_retry_after_holds_shipping_no_longer_than_the_backoff_cap(
    spool: Spool, caplog: pytest.LogCaptureFixture
):
    """A maintenance page's ``Retry-After: 86400`` must not hold every record for a day."""
    from collectors.shipper import BACKOFF_MAX
    from ledger.errors import Pushback

    shipper = Shipper(spool, LedgerClient("http://127.0.0.1:9", "t"))
    shipper._stop.set()  # the wait returns at once: only the delay chosen is looked at
    with caplog.at_level("WARNING", logger="ledger.collector.shipper"):
        shipper._retry([], Pushback("down for maintenance", code="http_503", retry_after=86400))
    assert f"retrying in {BACKOFF_MAX:.1f} s" in caplog.text, caplog.text


def test_records_of_a_key_the_ledger_does_not_know_wait_for_it(api: Harness, spool: Spool):
    """After a ledger restored from a backup older than the collector's key registration,
    every record is refused unknown_key: they wait (with backoff) for the key, never set
    aside one by one."""
    from ledger.records import RECORD_KIND
    from ledger.signing import SigningKey, sign_envelope

    key, fp_id = api.setup_collector()
    stranger = SigningKey.generate()  # never registered
    envs = [sign_envelope(RECORD_KIND, api.record(key, fp_id).body, stranger) for _ in range(4)]
    for env in envs:
        spool.put(env.body["request_id"], env.canonical)
    failures: list[str] = []
    client = LedgerClient(api.url, api.token("records:write"))
    shipper = Shipper(spool, client, on_failure=failures.append).start()
    try:
        deadline = time.monotonic() + 10
        while len(failures) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        shipper.stop()
        client.close()
    assert "unknown_key" in failures
    assert spool.dead_letters() == 0 and spool.pending() == 4


def test_a_spool_that_cannot_be_opened_is_named(tmp_path: Path):
    from ledger.errors import StorageError

    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StorageError, match="cannot open the spool"):
        Spool(tmp_path / "file" / "spool.sqlite")


def test_a_record_from_a_clock_that_runs_ahead_waits_and_gets_in(api: Harness, spool: Spool):
    """The ledger refuses, for now, a record that starts more than a minute after it receives
    it; the shipper keeps it (never a dead letter) and it gets in once that is no longer so."""
    from ledger.clock import rfc3339
    from ledger.records import RECORD_KIND, STARTED_SKEW
    from ledger.signing import sign_envelope
    from tests.support.documents import record_body

    key, fp_id = api.setup_collector()
    body = record_body(fp_id)
    ahead = datetime.now(UTC) + STARTED_SKEW + timedelta(seconds=1.5)
    body["timings"]["started_at"] = rfc3339(ahead)
    env = sign_envelope(RECORD_KIND, body, key)
    shipped = ship(api, spool, [env])
    assert shipped.failures[0] == "record_from_the_future", shipped.failures
    assert spool.pending() == 0 and spool.dead_letters() == 0
    assert held(api, [env]) == [200]
    # taken only once its start was no longer more than the skew after the ledger's clock
    got = api.client().get(f"/v1/records/{body['request_id']}").json()
    assert datetime.fromisoformat(got["received_at"]) >= ahead - STARTED_SKEW


@pytest.mark.parametrize("trickle_after", [b"", b"\r\n\r\n"], ids=["head", "body"])
def test_an_answer_that_trickles_is_abandoned_at_the_deadline_and_shipped_again(
    api: Harness, spool: Spool, caplog: pytest.LogCaptureFixture, trickle_after: bytes
):
    """A proxy in front of the ledger passes the batch on, then relays the ledger's answer a
    byte every 0.2 s (its head, or its body after the head): httpx's timeouts, which bound
    each read, never fire. The shipper gives the POST up at its deadline, closes the
    connection, counts and logs the failure and keeps the record; shipped again to a ledger
    that answers, the record the ledger took the first time is answered duplicate and
    acknowledged, held once."""
    from tests.support.tcp_relay import TcpRelay

    key, fp_id = api.setup_collector()
    env = api.record(key, fp_id)
    spool.put(env.body["request_id"], env.canonical)
    ledger = urlsplit(api.url)
    relay = TcpRelay(
        (str(ledger.hostname), int(ledger.port or 80)), trickle=0.2, trickle_after=trickle_after
    )
    failures: list[str] = []
    client = LedgerClient(relay.url, api.token("records:write"), deadline=1.0)
    shipper = Shipper(spool, client, linger=0, on_failure=failures.append)
    try:
        with caplog.at_level("WARNING", logger="ledger.collector.shipper"):
            started = time.monotonic()
            shipper.start()
            while not failures and time.monotonic() < started + 5:
                time.sleep(0.02)
            gave_up = time.monotonic() - started
            # the abandoned POST's connection was closed by the shipper, not left to trickle
            relay.wait_for(lambda c: c.closed_by_client.is_set(), timeout=1)
    finally:
        relay.close()
        shipper.stop()
        client.close()
    assert failures[:1] == ["ledger_too_slow"], failures
    assert 1.0 <= gave_up < 3.0, gave_up
    assert "ledger_too_slow" in caplog.text and "within 1 s" in caplog.text, caplog.text
    assert spool.pending() == 1 and spool.dead_letters() == 0
    taken = api.client().get(f"/v1/records/{env.body['request_id']}")
    assert taken.status_code == 200  # the ledger took the batch; its answer never came

    run = ship(api, spool, [], deadline=5.0)
    assert run.batches == [1] and run.failures == []
    assert spool.pending() == 0 and spool.dead_letters() == 0
    again = api.client().get(f"/v1/records/{env.body['request_id']}")
    assert again.json()["log_index"] == taken.json()["log_index"]
