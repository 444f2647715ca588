"""The append path: every accepted envelope becomes a log entry with a contiguous index.

Appends run inside ``Database.write()`` transactions, which hold the append lock, so indexes
are assigned in commit order and concurrent workers can never fork the sequence. The leaf and
the Merkle nodes it completes are written in the same transaction as the entry.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

import psycopg
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ledger.merkle import leaf_hash
from ledger.signing import Envelope
from ledger.storage import tree
from ledger.storage.bulk import insert_rows
from ledger.storage.database import Database
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


Entry = tuple[int, bytes, bytes]  # index, stored leaf hash, canonical envelope bytes


def scan(db: Database, chunk: int) -> Iterator[list[Entry]]:
    """Every log entry in index order, ``chunk`` rows at a time, from one read transaction.

    On Postgres a server-side cursor in binary format: the envelopes arrive as raw bytes
    rather than hex text (half the transfer, no encoding on either side)."""
    with db.read() as s:
        if not db.is_postgres:
            result = (
                s.connection()
                .execution_options(stream_results=True, yield_per=chunk)
                .execute(
                    select(LogEntry.idx, LogEntry.leaf_hash, LogEntry.envelope).order_by(
                        LogEntry.idx
                    )
                )
            )
            for part in result.partitions():
                yield [(idx, bytes(h), bytes(env)) for idx, h, env in part]
            return
        conn = s.connection().connection.driver_connection
        assert isinstance(conn, psycopg.Connection)
        with conn.cursor(name="ledger_log_scan", binary=True) as cur:
            cur.execute("SELECT idx, leaf_hash, envelope FROM log_entries ORDER BY idx")
            while rows := cur.fetchmany(chunk):
                yield rows
