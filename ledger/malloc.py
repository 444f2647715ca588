"""Megabyte buffers go back to the system when freed: glibc's mmap threshold, fixed.

glibc gives an allocation above its mmap threshold (128 KiB) a mapping of its own, unmapped
when freed. But each time such a chunk is freed, glibc raises the threshold to that chunk's
size (up to 32 MiB on 64-bit), so from then on megabyte-sized buffers (an ingest batch's body,
its parsed JSON, a shipped batch) come from the heap of the thread's arena instead, and stay
resident there for as long as one smaller live allocation sits above them. A server handling
such batches on worker threads grows that way for hours. Setting the threshold explicitly
turns that adjustment off (``mallopt(3)``: ``M_MMAP_THRESHOLD``), which is what
:func:`fix_mmap_threshold` does; an operator's own ``MALLOC_MMAP_THRESHOLD_`` is left as set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD = 128 * 1024  # glibc's default, kept, only no longer raised
ENV = "MALLOC_MMAP_THRESHOLD_"


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process. False, and nothing
    changed, where the C library is not glibc or the operator set :data:`ENV`."""
    if ENV in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    return bool(libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold)))
