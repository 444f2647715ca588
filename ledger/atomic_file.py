"""Files written whole or not at all (bundles, reports, fingerprints; secrets have their own
rules in ``ledger.secretfile``)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

# link(2) is not supported everywhere (some network and FUSE file systems).
_NO_LINK = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}


def write_atomically(path: Path, data: bytes, *, overwrite: bool = True) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, synced, renamed into
    place (a reader sees the old file or the new one, never a part). The temporary file is
    created anew under a random name, readable by its owner only (``mkstemp``: exclusive, so a
    symlink planted beside the target is never followed): bundles hold prompts and outputs.

    Without ``overwrite`` a name already taken (a file, a directory, a symbolic link, even a
    dangling one) raises :class:`FileExistsError` and nothing there changes: the file is
    published by ``link(2)``, which fails if the name exists at that instant. (On a file
    system without ``link(2)`` the name is looked at, then replaced: a file another process
    creates between the two is replaced.)"""
    descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    temporary = Path(name)
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if overwrite:
            os.replace(temporary, path)
        else:
            _publish_new(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _publish_new(temporary: Path, path: Path) -> None:
    try:
        os.link(temporary, path, follow_symlinks=False)
        return
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
    if os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
    os.replace(temporary, path)
