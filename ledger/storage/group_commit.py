"""Group commit: concurrent writers share one transaction, one lock and one fsync.

Every ingest batch used to take the append lock and commit on its own: with many collectors
each shipping a few records, the lock and the commit, not the records, set the pace. A
``GroupCommit`` hands items to one writer thread, which takes everything queued (up to a
size budget) and writes it with one call; each item's future then gets its own outcome. No
item's future completes before the transaction holding it has committed, so an answer still
means the data is durable.

The writer thread starts on the first submission and ends after ``idle_seconds`` without
work (a process that stops ingesting holds no thread); a later submission starts a new one.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# The writer's answer for each item, in order: a result, or the exception that item gets.
Write = Callable[[Sequence[T]], Sequence["R | BaseException"]]


class GroupCommit(Generic[T, R]):
    def __init__(
        self,
        write: Write[T, R],
        *,
        max_group: int,
        idle_seconds: float = 5.0,
        name: str = "group-commit",
        on_group: Callable[[int], None] = lambda _: None,
    ) -> None:
        """``write`` receives the items of one group in submission order and returns one
        outcome per item; ``max_group`` bounds the summed ``size`` of a group (an item larger
        than the budget still goes, alone); ``on_group`` hears each group's item count."""
        self._write = write
        self._max_group = max_group
        self._idle = idle_seconds
        self._name = name
        self._on_group = on_group
        self._cond = threading.Condition()
        self._queue: deque[tuple[T, int, Future[R]]] = deque()
        self._thread: threading.Thread | None = None
        self.groups = 0  # groups written so far (for tests and metrics)

    def submit(self, item: T, size: int = 1) -> Future[R]:
        future: Future[R] = Future()
        with self._cond:
            self._queue.append((item, size, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return future

    def _take(self) -> list[tuple[T, int, Future[R]]] | None:
        with self._cond:
            if not self._queue:
                self._cond.wait(self._idle)
            if not self._queue:
                self._thread = None  # under the lock: the next submit starts a new writer
                return None
            group: list[tuple[T, int, Future[R]]] = []
            budget = self._max_group
            while self._queue and (not group or self._queue[0][1] <= budget):
                item = self._queue.popleft()
                # A waiter that gave up before its item was taken (its client left) is not
                # written; once taken, an item can no longer be cancelled.
                if item[2].set_running_or_notify_cancel():
                    group.append(item)
                    budget -= item[1]
            return group

    def _run(self) -> None:
        while (group := self._take()) is not None:
            if not group:
                continue
            futures = [f for _, _, f in group]
            try:
                outcomes = list(self._write([item for item, _, _ in group]))
                if len(outcomes) != len(group):
                    raise RuntimeError(f"{len(outcomes)} outcomes for {len(group)} items")
            except Exception as exc:  # every waiter hears of it; the writer carries on
                outcomes = [exc] * len(group)
            self.groups += 1
            self._on_group(len(group))
            for future, outcome in zip(futures, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
