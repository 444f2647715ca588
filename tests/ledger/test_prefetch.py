"""Read-ahead iterator: same items in order, errors reach the consumer, early exit cleans up."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from ledger.storage.prefetch import prefetched


def test_yields_every_item_in_order_from_another_thread():
    threads: set[str] = set()

    def source() -> Iterator[int]:
        for i in range(100):
            threads.add(threading.current_thread().name)
            yield i

    assert list(prefetched(source(), ahead=3)) == list(range(100))
    assert threads == {"ledger-prefetch"}


def test_an_error_in_the_source_reaches_the_consumer_after_what_came_before():
    def source() -> Iterator[int]:
        yield 1
        yield 2
        raise RuntimeError("scan failed")

    got = []
    with pytest.raises(RuntimeError, match="scan failed"):
        for item in prefetched(source()):
            got.append(item)
    assert got == [1, 2]


def test_leaving_early_closes_the_source_and_ends_the_thread():
    closed = threading.Event()

    def source() -> Iterator[int]:
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    reader = prefetched(source(), ahead=2)
    assert [next(reader) for _ in range(5)] == [0, 1, 2, 3, 4]
    reader.close()
    assert closed.wait(5)
    deadline = time.monotonic() + 5
    while any(t.name == "ledger-prefetch" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the read-ahead thread did not end"
        time.sleep(0.01)
