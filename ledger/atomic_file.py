"""Files written whole or not at all (bundles, reports, fingerprints; secrets have their own
rules in ``ledger.secretfile``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, synced, renamed into
    place (a reader sees the old file or the new one, never a part). The temporary file is
    created anew under a random name, readable by its owner only (``mkstemp``: exclusive, so a
    symlink planted beside the target is never followed): bundles hold prompts and outputs."""
    descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    temporary = Path(name)
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
