"""A ledger seeded the way a collector starts: log key, a registered collector, a fingerprint."""

from __future__ import annotations

from dataclasses import dataclass

from ledger.signing import SigningKey, public_key_pem
from ledger.storage import ingest, keystore
from ledger.storage.database import Database
from tests.support.documents import fingerprint_envelope


@dataclass(frozen=True)
class Seeded:
    log_key: SigningKey
    collector: SigningKey
    fingerprint_id: str


def seed_ledger(db: Database, log_key: SigningKey | None = None, name: str = "c") -> Seeded:
    """Leaves 0-2: the log key's registration, a collector key's, and a fingerprint."""
    log_key = log_key or SigningKey.generate()
    collector = SigningKey.generate()
    keystore.ensure_log_key(db, log_key)
    keystore.register_key(
        db, log_key, name=name, role="collector", public_key=public_key_pem(collector.public_key)
    )
    fp = ingest.add_fingerprint(db, fingerprint_envelope(collector).to_dict()).fingerprint_id
    return Seeded(log_key, collector, fp)
