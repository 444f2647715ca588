"""GroupCommit: concurrent submissions share one write; each gets its own outcome."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from ledger.storage.group_commit import GroupCommit


class Recorder:
    """A write that records its groups; the first group waits until released, so that
    submissions made meanwhile queue behind it."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: Sequence[int]) -> list[int | BaseException]:
        self.groups.append(list(items))
        self.started.set()
        self.release.wait(10)
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]


def test_items_queued_behind_a_write_go_together_in_order_with_their_own_outcomes():
    write = Recorder()
    gc: GroupCommit[int, int] = GroupCommit(write, max_group=100)
    first = gc.submit(0)
    assert write.started.wait(5)
    later = [gc.submit(i) for i in range(1, 7)]
    write.release.set()
    assert first.result(5) == 0
    assert [f.exception(5) is None for f in later] == [False, True] * 3
    assert [later[i].result() for i in (1, 3, 5)] == [20, 40, 60]
    assert str(later[0].exception()) == "odd 1"
    assert write.groups == [[0], [1, 2, 3, 4, 5, 6]]
    assert gc.groups == 2


def test_a_group_stays_within_its_budget_and_an_oversized_item_goes_alone():
    write = Recorder()
    gc: GroupCommit[int, int] = GroupCommit(write, max_group=5)
    gc.submit(0, size=1)
    assert write.started.wait(5)
    futures = [gc.submit(i, size=s) for i, s in ((2, 3), (4, 2), (6, 9), (8, 1))]
    write.release.set()
    for f in futures:
        f.result(5)
    assert write.groups == [[0], [2, 4], [6], [8]]


def test_a_failed_write_fails_its_group_only_and_the_writer_carries_on():
    calls: list[list[str]] = []
    gate = threading.Event()

    def write(items: Sequence[str]) -> list[str]:
        calls.append(list(items))
        gate.wait(5)
        if "bad" in items:
            raise RuntimeError("database went away")
        return [s.upper() for s in items]

    gc: GroupCommit[str, str] = GroupCommit(write, max_group=10)
    blocker = gc.submit("first")
    time.sleep(0.05)
    doomed = [gc.submit("bad"), gc.submit("good")]
    gate.set()
    assert blocker.result(5) == "FIRST"
    for f in doomed:
        with pytest.raises(RuntimeError, match="database went away"):
            f.result(5)
    assert gc.submit("after").result(5) == "AFTER"


def test_a_write_answering_the_wrong_number_of_outcomes_fails_its_items():
    gc: GroupCommit[int, int] = GroupCommit(lambda items: [1, 2, 3], max_group=10)
    with pytest.raises(RuntimeError, match="3 outcomes for 1 items"):
        gc.submit(7).result(5)


def test_an_item_whose_waiter_left_before_it_was_taken_is_not_written():
    write = Recorder()
    gc: GroupCommit[int, int] = GroupCommit(write, max_group=100)
    gc.submit(0)
    assert write.started.wait(5)
    gone, kept = gc.submit(2), gc.submit(4)
    assert gone.cancel()
    write.release.set()
    assert kept.result(5) == 40
    assert write.groups == [[0], [4]]


def test_a_taken_item_can_no_longer_be_cancelled():
    write = Recorder()
    gc: GroupCommit[int, int] = GroupCommit(write, max_group=100)
    taken = gc.submit(2)
    assert write.started.wait(5)
    assert not taken.cancel()
    write.release.set()
    assert taken.result(5) == 20


def test_the_writer_thread_ends_when_idle_and_a_new_one_starts_on_demand():
    gc: GroupCommit[int, int] = GroupCommit(
        lambda items: [i + 1 for i in items], max_group=10, idle_seconds=0.05, name="idle-test"
    )
    assert gc.submit(1).result(5) == 2
    deadline = time.monotonic() + 5
    while gc._thread is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gc._thread is None
    assert not [t for t in threading.enumerate() if t.name == "idle-test"]
    assert gc.submit(2).result(5) == 3
