"""Read ahead: run an iterator in a background thread, a bounded number of items ahead.

Used where a database scan alternates with CPU work on what it returned (the audit): the
driver waits for the server without the GIL, so the next chunk is on its way while this one
is checked. Exceptions reach the consumer; leaving early closes the iterator in its thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


def prefetched(source: Iterator[T], ahead: int = 2) -> Generator[T, None, None]:
    """Yield what ``source`` yields, fetched by a worker thread up to ``ahead`` items early."""
    items: queue.Queue[object] = queue.Queue(maxsize=ahead)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in source:
                if not put((item,)):
                    break
        except BaseException as exc:  # handed to the consumer, raised there
            put(exc)
        else:
            put(_DONE)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    worker = threading.Thread(target=run, name="ledger-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            got = items.get()
            if got is _DONE:
                return
            if isinstance(got, BaseException):
                raise got
            assert isinstance(got, tuple)
            yield got[0]
    finally:
        stop.set()
        worker.join()
