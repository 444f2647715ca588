"""A persistent cache of file digests, so an unchanged model re-snapshots in milliseconds.

An entry is keyed by the file's real path and trusted only while the file's (device, inode,
size, mtime_ns, ctime_ns) are unchanged; any write, replacement or move invalidates it. The
change time is in the stamp because the modification time is not enough: ``cp -p``,
``rsync -t``, ``tar -x`` and ``touch -r`` rewrite a file and then set its mtime back, while
no user can set a file's ctime. The cache is a
SQLite file (WAL) under the user's cache directory. It is an optimisation only: if the file
cannot be opened or written, snapshots still work and hash everything. A cache file another
user could write (group- or other-writable, owned by someone else, or in a directory others
may write to) is not read: an entry written there would make a fingerprint claim a digest of
content that is not on disk.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import astuple, dataclass
from pathlib import Path

from ledger.secretfile import make_private_dirs, writable_by_others

CACHE_ENV = "LEDGER_DIGEST_CACHE"
_TABLE = "file_stamps"


def default_cache_path() -> Path:
    """``$LEDGER_DIGEST_CACHE``, else ``$XDG_CACHE_HOME/inference-ledger/digests.sqlite``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inference-ledger" / "digests.sqlite"


@dataclass(frozen=True)
class FileStamp:
    """What must be unchanged for a cached digest to hold."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, stat: os.stat_result) -> FileStamp:
        return cls(stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


class DigestCache:
    """Thread-safe get/put of SHA-256 hex digests by (real path, stamp)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.error: str | None = None
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        if path is not None:
            self._open(path)

    def _open(self, path: Path) -> None:
        try:
            # made private whatever the umask (002 would make them group-writable: untrusted),
            # and judged before anything is written to it
            make_private_dirs(path.parent)
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
            others = writable_by_others(path)
            if others is not None:
                self.error = f"digest cache {path} not trusted: {others}; hashing every file"
                return
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            # The first version's table had no ctime: its entries cannot be trusted.
            conn.execute("DROP TABLE IF EXISTS file_digests")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {_TABLE} ("
                " path TEXT PRIMARY KEY, device INTEGER NOT NULL, inode INTEGER NOT NULL,"
                " size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,"
                " sha256 TEXT NOT NULL)"
            )
        except (OSError, sqlite3.Error) as exc:
            self.error = f"digest cache {path} unusable ({exc}); hashing every file"
            return
        self._conn = conn

    def get(self, real_path: str, stamp: FileStamp) -> str | None:
        if self._conn is None:
            return None
        with self._lock:
            try:
                row = self._conn.execute(
                    f"SELECT device, inode, size, mtime_ns, ctime_ns, sha256 FROM {_TABLE}"
                    " WHERE path = ?",
                    (real_path,),
                ).fetchone()
            except (sqlite3.Error, UnicodeEncodeError):  # a name that is not UTF-8
                return None
        if row is None or FileStamp(*row[:5]) != stamp:
            return None
        return str(row[5])

    def put(self, real_path: str, stamp: FileStamp, sha256_hex: str) -> None:
        if self._conn is None:
            return
        with self._lock:
            try:
                self._conn.execute(
                    f"INSERT OR REPLACE INTO {_TABLE} VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (real_path, *astuple(stamp), sha256_hex),
                )
            except UnicodeEncodeError:
                pass  # a name that is not UTF-8: never cached
            except sqlite3.Error as exc:
                self.error = f"digest cache write failed ({exc})"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
