"""Small files named by people (keys, tokens, checkpoints): read whole, with a size limit.

A path given by mistake (``/dev/zero``, a FIFO with no writer, a directory, a 4 GiB log) is
refused with one clear message instead of being read until memory runs out or waiting forever.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ledger.errors import InvalidInput

SMALL_FILE_LIMIT = 1 << 20  # 1 MiB: far above any key, token or checkpoint


def read_small_file(path: Path, what: str, *, limit: int = SMALL_FILE_LIMIT) -> bytes:
    """The bytes of the regular file ``path`` (``what`` names it in messages: "key",
    "token file"); :class:`InvalidInput` when it cannot be read, is not a regular file or is
    larger than ``limit``."""
    try:
        # O_NONBLOCK: opening a FIFO never waits for a writer; it is then refused as not a file.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise _unreadable(path, what, exc) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput(
                f"cannot read {what} {path}: not a regular file",
                code="not_a_regular_file",
                details={"path": str(path)},
            )
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise _unreadable(path, what, exc) from exc
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InvalidInput(
            f"{what} {path} is larger than {limit:,} bytes: not a {what}",
            code="file_too_large",
            details={"path": str(path), "limit": limit},
        )
    return data


def read_small_text(path: Path, what: str, *, limit: int = SMALL_FILE_LIMIT) -> str:
    """:func:`read_small_file` decoded as UTF-8 (one leading byte-order mark skipped)."""
    data = read_small_file(path, what, limit=limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"{what} {path} is not UTF-8 text (byte {exc.start} is not valid UTF-8)",
            code="not_utf8",
            details={"path": str(path)},
        ) from exc


def _unreadable(path: Path, what: str, exc: OSError) -> InvalidInput:
    return InvalidInput(
        f"cannot read {what} {path}: {exc.strerror or exc}",
        code="file_not_readable",
        details={"path": str(path)},
    )
