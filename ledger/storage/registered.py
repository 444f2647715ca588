"""What never changes once registered, remembered per database for the ingest path.

A key's registration (its role and public key) and a fingerprint's body are log entries:
neither changes after it is written, so every ingest batch need not read them again. Only a
key's revocation changes, and the append re-reads revocations under its lock
(``keystore.revoked_among``), so a key remembered here as unrevoked and revoked since is
still refused. Keys not yet registered, and revoked ones, are not remembered.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from ledger.errors import NotFound
from ledger.storage import keystore
from ledger.storage.cache import chat_template_digest, fingerprint_body
from ledger.storage.database import Database
from ledger.storage.keystore import KeyInfo

V = TypeVar("V")
_LIMIT = 4096  # entries per database and kind; past it the memo starts again


class _Memo(Generic[V]):
    def __init__(self) -> None:
        self._by_db: weakref.WeakKeyDictionary[Database, dict[str, V]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(
        self,
        db: Database,
        ids: Iterable[str],
        read: Callable[[set[str]], dict[str, V]],
        keep: Callable[[V], bool] = lambda _: True,
    ) -> dict[str, V]:
        """The values of ``ids``: remembered ones, and ``read(missing)`` for the others
        (an ID ``read`` does not answer is left out)."""
        wanted = set(ids)
        with self._lock:
            memo = self._by_db.setdefault(db, {})
            out = {i: memo[i] for i in wanted if i in memo}
        missing = wanted - out.keys()
        if missing:
            found = read(missing)
            out.update(found)
            with self._lock:
                if len(memo) + len(found) > _LIMIT:
                    memo.clear()
                memo.update((i, v) for i, v in found.items() if keep(v))
        return out


_KEYS: _Memo[KeyInfo] = _Memo()
_TEMPLATES: _Memo[str | None] = _Memo()


def signer_keys(db: Database, key_ids: Iterable[str]) -> dict[str, KeyInfo]:
    """Registered keys by ID (unknown IDs left out), as ``keystore.load_keys`` reads them."""

    def read(missing: set[str]) -> dict[str, KeyInfo]:
        with db.read() as s:
            return keystore.load_keys(s, missing)

    # Kept: keys not revoked whose registration verified (an "unverified" key, its leaf
    # edited, is read again: once the leaf is restored, the key signs again).
    return _KEYS.get(
        db,
        key_ids,
        read,
        keep=lambda info: info.revoked_at is None and info.role != keystore.UNVERIFIED_ROLE,
    )


def chat_templates(db: Database, fingerprint_ids: Iterable[str]) -> dict[str, str | None]:
    """The chat-template digest each registered fingerprint names (None: it names none);
    fingerprints not registered are left out."""

    def read(missing: set[str]) -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        with db.read() as s:
            for fp in sorted(missing):
                try:
                    found[fp] = chat_template_digest(fingerprint_body(s, fp))
                except NotFound:
                    continue
        return found

    return _TEMPLATES.get(db, fingerprint_ids, read)
