"""glibc's mmap threshold, fixed: a megabyte buffer is its own mapping even after a bigger
one was freed (each check in a fresh interpreter: the threshold is per process)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ledger.malloc import ARENA_ENV, ENV, trim_every

ROOT = Path(__file__).resolve().parents[2]

# How many live mmapped chunks a 1 MiB buffer adds once a 4 MiB one was freed (mallinfo2).
PROBE = """
import ctypes, sys
from ledger.malloc import fix_mmap_threshold
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
        "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
fixed = fix_mmap_threshold() if sys.argv[1] == "fix" else None
freed = bytearray(4 << 20)
del freed
before = libc.mallinfo2().hblks
kept = bytearray(1 << 20)
print(fixed, libc.mallinfo2().hblks - before)
"""

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the threshold is glibc's"
)


def _run(code: str, *args: str, without: str = "", **env: str) -> list[str]:
    """What a fresh interpreter running ``code`` prints, words split (``without``: a variable
    of this environment it does not get)."""
    environ = {k: v for k, v in os.environ.items() if k != without} | env
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def _probe(mode: str, **env: str) -> tuple[str, int]:
    out = _run(PROBE, mode, without=ENV, **env)
    return out[0], int(out[1])


def test_without_the_fix_glibc_serves_the_next_megabyte_from_the_heap():
    assert _probe("none") == ("None", 0)  # the control: the threshold rose to 4 MiB


def test_with_the_fix_a_megabyte_buffer_is_still_its_own_mapping():
    assert _probe("fix") == ("True", 1)


def test_an_operators_own_setting_is_left_as_set():
    assert _probe("fix", **{ENV: "8388608"}) == ("False", 0)  # 8 MiB: 1 MiB is heap


# The resident memory of a heap whose free space lies between live blocks, before and after
# trim_now (the small blocks are below the mmap threshold: they come from the heap).
TRIM = """
import sys
from ledger.malloc import limit_arenas, trim_now
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
limited = limit_arenas()
blocks = [bytearray(4000) for _ in range(50_000)]  # about 200 MB
kept = blocks[::64]  # one live block in every 256 KB: the heap cannot shrink from its top
del blocks
before = rss()
trimmed = trim_now()
print(limited, trimmed, before - rss())
"""


def test_trimming_hands_free_heap_pages_back_to_the_system():
    out = _run(TRIM, without=ARENA_ENV)
    assert out[:2] == ["True", "True"]
    assert int(out[2]) > 100 << 20  # most of the 200 MB freed is no longer resident


def test_an_operators_arena_limit_is_left_as_set():
    probe = "from ledger.malloc import limit_arenas; print(limit_arenas())"
    assert _run(probe, **{ARENA_ENV: "4"}) == ["False"]


def test_the_trimming_thread_runs_until_stopped():
    stop = trim_every(0.01)
    assert stop is not None
    assert any(t.name == "malloc-trim" for t in threading.enumerate())
    stop.set()
    for _ in range(100):
        if not any(t.name == "malloc-trim" for t in threading.enumerate()):
            break
        time.sleep(0.01)
    assert not any(t.name == "malloc-trim" for t in threading.enumerate())
