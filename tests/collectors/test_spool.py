"""The durable spool: commit before answer, survive reopening, ack and dead letters."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from collectors import spool as spool_module
from collectors.spool import WAL_SIZE_LIMIT, Spool
from ledger.errors import Conflict, StorageError


def test_put_is_durable_and_survives_reopening(tmp_path: Path):
    spool = Spool(tmp_path / "s.sqlite")
    spool.put("r1", b'{"a":1}')
    spool.put("r2", b'{"a":2}')
    assert spool.holds("r1") and spool.pending() == 2
    spool.close()
    again = Spool(tmp_path / "s.sqlite")
    assert [(i.request_id, i.envelope) for i in again.oldest(10)] == [
        ("r1", b'{"a":1}'),
        ("r2", b'{"a":2}'),
    ]
    assert again.holds("r2")
    again.close()


def test_a_reused_request_id_is_refused(tmp_path: Path):
    spool = Spool(tmp_path / "s.sqlite")
    spool.put("r1", b"x")
    with pytest.raises(Conflict) as err:
        spool.put("r1", b"y")
    assert err.value.code == "request_id_in_use"
    assert spool.pending() == 1
    spool.close()


def test_ack_and_dead_letter(tmp_path: Path):
    spool = Spool(tmp_path / "s.sqlite")
    for i in range(5):
        spool.put(f"r{i}", b"x")
    items = spool.oldest(10)
    spool.ack([items[0].seq, items[1].seq])
    spool.dead_letter(items[2], "record_conflict: held with other content")
    assert spool.pending() == 2 and spool.dead_letters() == 1
    # Shipped or set aside, an ID stays used: the ledger would refuse a second record under it.
    assert all(spool.holds(f"r{i}") for i in range(5)) and not spool.holds("r5")
    spool.failed([items[3].seq], "ledger_unreachable")
    spool.close()


def test_concurrent_puts_are_group_committed(tmp_path: Path):
    spool = Spool(tmp_path / "s.sqlite")
    threads = [
        threading.Thread(target=lambda i=i: spool.put(f"r{i}", b"x" * 100)) for i in range(64)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert spool.pending() == 64
    spool.close()


def test_a_group_with_used_request_ids_refuses_only_those(tmp_path: Path):
    """One group commit holding an ID used before and an ID twice: those are refused, each
    alone, and every other record of the group is in, whole, exactly once."""
    spool = Spool(tmp_path / "s.sqlite")
    spool.put("used", b"old")
    with spool._write_lock:  # the writer waits here while the group queues up
        futures = [
            spool.submit(request_id, envelope)
            for request_id, envelope in [
                ("a", b"A"),
                ("used", b"new"),
                ("b", b"B"),
                ("a", b"again"),
                ("c", b"C"),
            ]
        ]
    outcomes = []
    for future in futures:
        try:
            future.result(5)
            outcomes.append("ok")
        except Conflict as exc:
            outcomes.append(exc.code)
    assert outcomes == ["ok", "request_id_in_use", "ok", "request_id_in_use", "ok"]
    assert [(i.request_id, i.envelope) for i in spool.oldest(10)] == [
        ("used", b"old"),
        ("a", b"A"),
        ("b", b"B"),
        ("c", b"C"),
    ]
    assert all(spool.holds(request_id) for request_id in ("a", "b", "c", "used"))
    spool.close()


def test_fingerprints_wait_for_registration(tmp_path: Path):
    spool = Spool(tmp_path / "s.sqlite")
    spool.add_fingerprint("sha256:a", b"{}")
    spool.add_fingerprint("sha256:a", b"{}")
    assert spool.unregistered_fingerprints() == [("sha256:a", b"{}")]
    spool.fingerprint_registered("sha256:a")
    assert spool.unregistered_fingerprints() == []
    spool.close()


def test_put_now_commits_on_the_callers_thread_when_idle(tmp_path: Path):
    spool = Spool(tmp_path / "s.sqlite")
    assert spool.put_now("r1", b'{"a":1}') is True
    assert spool.holds("r1") and spool.added.is_set()
    with pytest.raises(Conflict) as err:
        spool.put_now("r1", b'{"a":2}')
    assert err.value.code == "request_id_in_use"
    spool.close()
    again = Spool(tmp_path / "s.sqlite")
    assert [(i.request_id, i.envelope) for i in again.oldest(10)] == [("r1", b'{"a":1}')]
    again.close()


def test_put_now_declines_while_another_write_runs_or_once_closed(tmp_path: Path):
    spool = Spool(tmp_path / "s.sqlite")
    with spool._write_lock:  # an ack, a dead letter or the writer's group commit under way
        assert spool.put_now("r1", b"x") is False
    assert not spool.holds("r1") and spool.pending() == 0
    spool.put("r2", b"y")  # the writer thread still works after a declined put_now
    assert spool.put_now("r3", b"z") is True
    assert [i.request_id for i in spool.oldest(10)] == ["r2", "r3"]
    spool.close()
    assert spool.put_now("r4", b"w") is False
    with pytest.raises(StorageError):
        spool.submit("r4", b"w")


def test_a_cancelled_wait_is_dropped_and_the_writer_keeps_working(tmp_path: Path):
    # A streamed exchange whose client leaves while it waits for the commit cancels the
    # future (asyncio.wrap_future) and records the exchange as aborted instead. Setting a
    # result on that cancelled future used to kill the writer thread: every later put hung.
    spool = Spool(tmp_path / "s.sqlite")
    with spool._write_lock:  # the writer takes r1's batch and waits here
        first = spool.submit("r1", b"a")
        while spool._queue:
            time.sleep(0.001)
        second = spool.submit("r2", b"b")
        assert second.cancel()
    first.result(5)
    spool.put("r3", b"c", timeout=5)
    assert [i.request_id for i in spool.oldest(10)] == ["r1", "r3"]
    assert not spool.holds("r2")
    spool.close()


def test_a_shipped_request_id_stays_refused_until_forgotten(tmp_path: Path):
    spool = Spool(tmp_path / "s.sqlite")
    spool.put("shipped", b"x")
    spool.put("pending", b"y")
    spool.ack([spool.oldest(1)[0].seq])
    assert spool.holds("shipped") and spool.pending() == 1
    with pytest.raises(Conflict) as err:
        spool.put("shipped", b"z")
    assert err.value.code == "request_id_in_use"
    spool.close()
    spool = Spool(tmp_path / "s.sqlite")  # remembered across restarts
    assert spool.holds("shipped")
    with pytest.raises(Conflict):
        spool.put_now("shipped", b"z")
    # Past the retention, shipped IDs are forgotten; a pending record's ID never is.
    assert spool.forget_request_ids(time.time() + 1, chunk=1) == 2
    assert not spool.holds("shipped") and spool.holds("pending")
    spool.put("shipped", b"again")
    spool.close()


def test_a_spool_from_before_the_request_id_table_keeps_its_pending_ids(tmp_path: Path):
    path = tmp_path / "s.sqlite"
    Spool(path).close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE request_ids")
        db.execute("INSERT INTO spool (request_id, envelope, spooled_at) VALUES ('old', x'00', 1)")
    db.close()
    spool = Spool(path)
    assert spool.holds("old")
    spool.forget_request_ids(time.time())
    assert spool.holds("old")  # still pending
    with pytest.raises(Conflict):
        spool.put("old", b"x")
    spool.close()


def test_a_failed_transaction_is_rolled_back_and_recording_goes_on(tmp_path: Path):
    # A write the database refuses (here a trigger; a full disk in production) must not leave
    # the write connection inside a transaction: every later commit would fail.
    spool = Spool(tmp_path / "s.sqlite")
    spool.put("r1", b"x")
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        db.execute(
            "CREATE TRIGGER no_delete BEFORE DELETE ON spool BEGIN SELECT RAISE(ABORT, 'no'); END"
        )
    db.close()
    with pytest.raises(sqlite3.IntegrityError):
        spool.ack([spool.oldest(1)[0].seq])
    spool.put("r2", b"y")
    assert spool.put_now("r3", b"z") is True
    assert [i.request_id for i in spool.oldest(10)] == ["r1", "r2", "r3"]
    spool.close()


def test_commits_leave_checkpoints_to_the_shipper(tmp_path: Path):
    # A commit that crosses SQLite's automatic checkpoint threshold (~4 MB of log) would copy
    # the log into the database, fsyncs included, on the request's path (the event loop, for
    # put_now). The spool checkpoints only when the shipper asks.
    path = tmp_path / "s.sqlite"
    spool = Spool(path)
    for i in range(12):
        spool.put_now(f"r{i}", bytes(500_000))
    assert path.stat().st_size < 1_000_000  # still in the log
    assert spool.checkpoint() is True  # over CHECKPOINT_BYTES since the last one
    assert path.stat().st_size > 6_000_000
    spool.put_now("one-more", b"x")
    assert spool.checkpoint() is False  # too little since
    spool.close()


def test_the_write_ahead_log_shrinks_back_after_a_burst(tmp_path: Path):
    """A burst grows the log past WAL_SIZE_LIMIT; once shipped and copied, the next write
    starts the log over and SQLite cuts the file back to the limit."""
    spool = Spool(tmp_path / "spool.sqlite")
    wal = tmp_path / "spool.sqlite-wal"
    try:
        envelope = b"x" * (1024 * 1024)
        for i in range((WAL_SIZE_LIMIT >> 20) + 8):
            spool.put(f"burst-{i}", envelope)
        assert wal.stat().st_size > WAL_SIZE_LIMIT
        spool.ack([item.seq for item in spool.oldest(10_000)])
        assert spool.checkpoint(at_least=0)
        spool.put("after", b"y")
        assert wal.stat().st_size <= WAL_SIZE_LIMIT
    finally:
        spool.close()


def test_content_past_the_retention_leaves_the_spool(tmp_path: Path):
    spool = Spool(tmp_path / "s.sqlite")
    for i in range(4):
        spool.put(f"old{i}", b"prompt and output")
    items = spool.oldest(10)
    spool.dead_letter(items[0], "refused")
    cutoff = time.time()
    time.sleep(0.01)
    spool.put("new", b"x")
    spool.dead_letter(spool.oldest(10)[-1], "refused")
    assert spool.expire_content(cutoff) == (3, 1)
    assert [i.request_id for i in spool.oldest(10)] == []
    assert spool.dead_letters() == 1 and spool.pending() == 0
    # the deleted records' IDs stay used: no record may reuse one
    assert all(spool.holds(f"old{i}") for i in range(4))
    spool.close()


def test_expired_content_leaves_no_bytes_in_the_spool_files(tmp_path: Path):
    """Neither the database file's free pages nor the write-ahead log keep what a retention
    purge deleted: read as a backup would read the files."""
    path = tmp_path / "s.sqlite"
    spool = Spool(path)
    secret = b"Patient Jane Roe, diagnosis zqxjv " * 200  # overflow pages too
    for i in range(3):
        spool.put(f"old{i}", secret + str(i).encode())
    spool.dead_letter(spool.oldest(1)[0], "refused")
    spool.checkpoint(at_least=0)  # some of it copied into the database file as well

    def files() -> bytes:
        return b"".join(p.read_bytes() for p in sorted(tmp_path.glob("s.sqlite*")))

    assert b"diagnosis zqxjv" in files()
    assert spool.expire_content(time.time() + 1) == (2, 1)
    assert b"diagnosis zqxjv" not in files()
    # zeroed on every connection, whatever SQLite's build defaults to
    assert spool._read.execute("PRAGMA secure_delete").fetchone()[0] == 1
    spool.close()


def test_the_write_ahead_log_stays_bounded_while_records_keep_coming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Under steady load a commit lands during every copy, so a passive checkpoint never
    copies the whole log, and SQLite starts a log over only once all of it is copied: without
    a finishing copy the log (and its index, mapped into the collector's memory) grows for as
    long as records keep coming (4 GB in 5 minutes at 550 requests/s)."""
    monkeypatch.setattr(spool_module, "CHECKPOINT_BYTES", 256 * 1024)
    monkeypatch.setattr(spool_module, "WAL_SIZE_LIMIT", 1024 * 1024)
    spool = Spool(tmp_path / "spool.sqlite")
    wal = tmp_path / "spool.sqlite-wal"
    envelope = b"x" * 16_384
    stop = threading.Event()
    written = [0, 0]

    def writer(n: int) -> None:
        while not stop.is_set():
            spool.put(f"w{n}-{written[n]}", envelope)
            written[n] += 1

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    largest = 0
    try:
        target = 32 * spool_module.WAL_SIZE_LIMIT
        while sum(written) * len(envelope) < target and all(t.is_alive() for t in threads):
            items = spool.oldest(500)  # as the shipper does: ship, ack, checkpoint
            spool.ack([item.seq for item in items])
            spool.checkpoint()
            largest = max(largest, wal.stat().st_size)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        spool.close()
    assert sum(written) * len(envelope) >= target, "a writer failed"
    # Started over, the log holds what came between the shipper's copies: 3-13 MB here and on
    # CI, as fast as the writers are against the loop above. Left to grow, it held every frame
    # written, about 4.5 times the records' bytes (143 MB): the bound sits between the two.
    assert largest <= target, f"the log grew to {largest:,} bytes"
