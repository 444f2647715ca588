"""glibc's mmap threshold, fixed: a megabyte buffer is its own mapping even after a bigger
one was freed (each check in a fresh interpreter: the threshold is per process)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.malloc import ENV

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


def _probe(mode: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k != ENV} | env
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], int(out[1])


def test_without_the_fix_glibc_serves_the_next_megabyte_from_the_heap():
    assert _probe("none") == ("None", 0)  # the control: the threshold rose to 4 MiB


def test_with_the_fix_a_megabyte_buffer_is_still_its_own_mapping():
    assert _probe("fix") == ("True", 1)


def test_an_operators_own_setting_is_left_as_set():
    assert _probe("fix", **{ENV: "8388608"}) == ("False", 0)  # 8 MiB: 1 MiB is heap
