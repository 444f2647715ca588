"""glibc's malloc, tuned for a long-running server: buffers and freed heap pages go back to the
system.

glibc gives an allocation above its mmap threshold (128 KiB) a mapping of its own, unmapped
when freed. But each time such a chunk is freed, glibc raises the threshold to that chunk's
size (up to 32 MiB on 64-bit), so from then on megabyte-sized buffers (an ingest batch's body,
its parsed JSON, a shipped batch) come from the heap of the thread's arena instead, and stay
resident there for as long as one smaller live allocation sits above them. A server handling
such batches on worker threads grows that way for hours. Setting the threshold explicitly
turns that adjustment off (``mallopt(3)``: ``M_MMAP_THRESHOLD``), which is what
:func:`fix_mmap_threshold` does.

Each thread that allocates may get an arena of its own (up to eight per core), and the free
space inside each arena's heap is kept by that arena: a server whose request threads come and
go fragments many heaps at once, and its resident memory grows with the free space they hold
(the ledger under cache lookups and ingest: +105 MB/h, bench/soak.py, docs/PERFORMANCE.md).
:func:`limit_arenas` caps the arenas at two (``M_ARENA_MAX``), and :func:`trim_every` hands the
free pages inside the heaps back to the system once a minute (``malloc_trim(3)``). An
operator's own ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_ARENA_MAX`` is left as set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import threading
from typing import Any

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
M_ARENA_MAX = -8
MMAP_THRESHOLD = 128 * 1024  # glibc's default, kept, only no longer raised
ARENA_MAX = 2
ENV = "MALLOC_MMAP_THRESHOLD_"
ARENA_ENV = "MALLOC_ARENA_MAX"
TRIM_SECONDS = 60.0

logger = logging.getLogger("ledger.malloc")


def _glibc() -> Any | None:
    """glibc, loaded (None on another C library)."""
    if platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name is not None else None


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process. False, and nothing
    changed, where the C library is not glibc or the operator set :data:`ENV`."""
    libc = None if ENV in os.environ else _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold)))


def limit_arenas(count: int = ARENA_MAX) -> bool:
    """Cap this process's malloc arenas at ``count`` (call it before threads start: an arena
    made stays). False, and nothing changed, where the C library is not glibc or the operator
    set :data:`ARENA_ENV`."""
    libc = None if ARENA_ENV in os.environ else _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(count)))


def trim_now() -> bool:
    """Hand the free pages inside every arena's heap back to the system (``malloc_trim(0)``):
    True when some memory was released. False where the C library is not glibc."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(ctypes.c_size_t(0)))


def trim_every(seconds: float = TRIM_SECONDS) -> threading.Event | None:
    """Start a daemon thread that calls :func:`trim_now` every ``seconds`` (a millisecond or a
    few each, on the heaps of a server measured); setting the event it returns stops it. None
    where the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return None
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(seconds):
            try:
                libc.malloc_trim(ctypes.c_size_t(0))
            except Exception:  # never let the trim take the server down
                logger.exception("malloc_trim failed")
                return

    threading.Thread(target=run, name="malloc-trim", daemon=True).start()
    return stop
