"""``ledger audit`` over a database: the pure audit (``ledger.audit``) joined to its reader.

The checks, their order and the report are described in ``ledger/audit/run.py``; the rows
come from ``ledger/storage/audit_reader.py``. ``CHUNK`` and ``PARALLEL_FROM`` are read at each
call, so tests can shrink them.
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger.audit import (
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_CLOCK_TOLERANCE,
    AuditOptions,
    AuditReport,
    Finding,
    Progress,
    run_audit,
)
from ledger.signing import public_key_raw
from ledger.storage.audit_reader import StorageAuditReader
from ledger.storage.database import Database

__all__ = ["AuditReport", "Finding", "audit"]

CHUNK = 2000
PARALLEL_FROM = 5000  # below this many leaves, starting worker processes costs more than it saves


def audit(
    db: Database,
    pinned_log_key: Ed25519PublicKey | None = None,
    progress: Progress | None = None,
    *,
    signatures: bool = True,
    trusted_checkpoints: Sequence[str] = (),
    workers: int = 1,
    clock_tolerance: float = DEFAULT_CLOCK_TOLERANCE,
    checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
) -> AuditReport:
    """Audit the whole log. ``signatures=False`` checks structure only (sequence, leaf
    hashes, tree, checkpoints, receive times) and needs the pinned log key to verify the
    checkpoints.

    ``trusted_checkpoints`` are signed notes seen earlier (kept from evidence bundles, or by a
    witness): the log must still hold each one's tree. Without them, deleting the newest
    leaves together with their checkpoints cannot be told from a log that never had them,
    unless those leaves are older than ``checkpoint_interval`` + ``clock_tolerance`` seconds.

    ``workers`` > 1 checks envelopes in that many processes (same findings).
    """
    options = AuditOptions(
        pinned_log_key=public_key_raw(pinned_log_key) if pinned_log_key is not None else None,
        signatures=signatures,
        trusted_checkpoints=tuple(trusted_checkpoints),
        workers=workers,
        chunk=CHUNK,
        parallel_from=PARALLEL_FROM,
        clock_tolerance=clock_tolerance,
        checkpoint_interval=checkpoint_interval,
    )
    return run_audit(StorageAuditReader(db), options, progress)
