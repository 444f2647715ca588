"""The engine watcher's poll (collectors.collector.Collector._poll), driven by hand: when it
refuses to record (``fingerprint_unsure`` while it snapshots) and when it does not.

A real Collector's poll, on stand-ins for the engine's HTTP answers and its snapshot only:
the processes are real (this test's own, alive; a child that has exited, gone)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import httpx

from collectors.collector import Collector


@dataclass
class Engine:
    """What the engine answers at each poll (True: 200, False: refused)."""

    up: list[bool]

    def get(self, url: str) -> SimpleNamespace:
        if not self.up.pop(0):
            raise httpx.ConnectError("refused")
        return SimpleNamespace(status_code=200)


@dataclass
class Watched:
    collector: Collector
    unsure_while_snapshotting: list[bool] = field(default_factory=list)


def _gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def watched(engine_pid: int | None, found: list[int | None]) -> Watched:
    """A collector that knows ``engine_pid`` and finds ``found`` in turn."""
    c = Collector.__new__(Collector)
    c.state = SimpleNamespace(engine_url="http://127.0.0.1:1", fingerprint_unsure=None)
    c._engine_pid = engine_pid
    c._gone = None
    w = Watched(c)
    c._find_pid = lambda: found.pop(0)  # type: ignore[method-assign]

    def snapshot() -> None:
        w.unsure_while_snapshotting.append(c.state.fingerprint_unsure is not None)
        c.state.fingerprint_unsure = None  # it holds

    c.resnapshot = snapshot  # type: ignore[method-assign]
    return w


def polls(w: Watched, engine: Engine) -> None:
    away = False
    while engine.up:
        away = w.collector._poll(engine, away)  # type: ignore[arg-type]


def test_an_engine_only_unreachable_for_a_while_refuses_nothing():
    """The same live process, back after a poll that failed: snapshotted again, as it was,
    without refusing a request meanwhile."""
    w = watched(os.getpid(), [os.getpid()])
    polls(w, Engine([True, False, True, True]))
    assert w.unsure_while_snapshotting == [False]


def test_a_restarted_engine_is_unsure_until_its_snapshot_holds():
    gone = _gone_pid()
    w = watched(gone, [os.getpid()])  # the old process gone, a new one found
    polls(w, Engine([True, True]))
    assert w.unsure_while_snapshotting == [True]
    assert w.collector._engine_pid == os.getpid()


def test_an_engine_whose_process_is_unknown_is_unsure_when_it_comes_back():
    w = watched(None, [None])
    polls(w, Engine([False, True, True]))
    assert w.unsure_while_snapshotting == [True]


def test_a_named_engine_process_that_is_gone_is_snapshotted_once_not_at_every_poll():
    """--engine-pid names a process that has exited: one snapshot says so; the polls after it
    refuse nothing (before, every poll set the flag and snapshotted again)."""
    gone = _gone_pid()
    w = watched(gone, [gone] * 5)
    polls(w, Engine([True] * 5))
    assert w.unsure_while_snapshotting == [True]
    # and once it is back from away under the same (gone) ID, it is unsure again
    polls(w, Engine([False, True]))
    assert w.unsure_while_snapshotting == [True, True]
