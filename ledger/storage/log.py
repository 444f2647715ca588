"""The append path: every accepted envelope becomes a log entry with a contiguous index.

Appends run inside ``Database.write()`` transactions, which hold the append lock, so indexes
are assigned in commit order and concurrent workers can never fork the sequence. The leaf and
the Merkle nodes it completes are written in the same transaction as the entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ledger.merkle import leaf_hash
from ledger.signing import Envelope
from ledger.storage import tree
from ledger.storage.bulk import insert_rows
from ledger.storage.models import LogEntry


def log_size(session: Session) -> int:
    top = session.execute(select(func.max(LogEntry.idx))).scalar_one_or_none()
    return 0 if top is None else int(top) + 1


_COLUMNS = ("idx", "kind", "leaf_hash", "envelope", "appended_at")


def append(session: Session, envelopes: Sequence[Envelope], at: datetime) -> list[int]:
    """Append envelopes as leaves; return their indexes. Caller holds the write lock."""
    if not envelopes:
        return []
    start = log_size(session)
    hashes = [leaf_hash(env.canonical) for env in envelopes]
    rows = [(start + i, env.kind, hashes[i], env.canonical, at) for i, env in enumerate(envelopes)]
    insert_rows(session, LogEntry, _COLUMNS, rows)
    tree.append_hashes(session, start, hashes)
    return list(range(start, start + len(rows)))


def read_envelope(session: Session, idx: int) -> bytes | None:
    return session.execute(select(LogEntry.envelope).where(LogEntry.idx == idx)).scalar()
