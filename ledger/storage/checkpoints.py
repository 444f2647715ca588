"""Signed checkpoints in storage: sign the current tree head, read the latest or a covering one.

Each note carries the time it was signed (``ledger.checkpoint``'s ``Timestamp:`` line), the
same instant as the row's ``signed_at``; ``ledger audit`` checks that the two agree. Each note
but the first names the checkpoint signed before it (``Previous:``): the latest stored one, or
the last this process signed when that is larger (the rows of later ones were deleted), so a
deletion is named by the next checkpoint this process signs (``ledger serve --workers N``: each
worker process remembers only its own).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from weakref import WeakKeyDictionary

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from ledger.checkpoint import Checkpoint, parse_checkpoint, previous_line, sign_checkpoint
from ledger.errors import IndexMismatch, InvalidInput, LedgerError, NotFound
from ledger.signing import SigningKey
from ledger.storage import log, tree
from ledger.storage.database import Database, as_utc, utcnow
from ledger.storage.models import CheckpointRow

logger = logging.getLogger(__name__)


def default_origin(log_key: SigningKey) -> str:
    """A log origin unique to the ledger's key, used unless LEDGER_LOG_ORIGIN names one."""
    return "inference-ledger/" + log_key.key_id.split(":", 1)[1][:16]


@dataclass(frozen=True)
class StoredCheckpoint:
    tree_size: int
    root_hash: bytes
    note: str
    signed_at: datetime


def disagreement(cp: StoredCheckpoint) -> str | None:
    """How a stored row differs from the note it holds (None: it does not). The note is what
    was signed; its size, root and time are what every reader is answered."""
    try:
        signed, _ = parse_checkpoint(cp.note)
    except LedgerError:
        return "the note does not parse"
    if signed.tree_size != cp.tree_size:
        return f"the note signs tree size {signed.tree_size}"
    if signed.root_hash != cp.root_hash:
        return "the note signs another root hash"
    if signed.signed_at is not None and signed.signed_at != cp.signed_at:
        return f"the note was signed at {signed.signed_at.isoformat()}"
    return None


def _row(row: CheckpointRow) -> StoredCheckpoint:
    return StoredCheckpoint(row.tree_size, bytes(row.root_hash), row.note, as_utc(row.signed_at))


def _stored(row: CheckpointRow) -> StoredCheckpoint:
    """The checkpoint a row holds, once its columns agree with its note (IndexMismatch if not:
    an edited size, root or time is never answered)."""
    cp = _row(row)
    problem = disagreement(cp)
    if problem is not None:
        logger.warning("checkpoint row of tree size %d: %s", cp.tree_size, problem)
        raise IndexMismatch(
            f"the checkpoint row of tree size {cp.tree_size} does not agree with its signed "
            f"note ({problem}): the database was edited; run `ledger audit` to find every "
            "such row",
            details={"tree_size": cp.tree_size},
        )
    return cp


def latest_in(session: Session) -> StoredCheckpoint | None:
    row = session.execute(
        select(CheckpointRow).order_by(CheckpointRow.tree_size.desc()).limit(1)
    ).scalar_one_or_none()
    return _stored(row) if row is not None else None


def latest(db: Database) -> StoredCheckpoint:
    with db.read() as s:
        cp = latest_in(s)
    if cp is None:
        raise NotFound("no checkpoint has been signed yet", code="no_checkpoint")
    return cp


# The last checkpoint this process signed of each database's log: a later note names it as
# its previous one even if its row was deleted since, and a deleted row of the current tree is
# put back as it was signed (never signed again, naming itself).
_signed_here: WeakKeyDictionary[Database, StoredCheckpoint] = WeakKeyDictionary()
_remembering = threading.Lock()


def _remember(db: Database, signed: StoredCheckpoint) -> None:
    """Note a checkpoint signed here, after its commit: two threads that signed one after the
    other may get here in the other order, and the memory must never go back to the older."""
    with _remembering:
        known = _signed_here.get(db)
        if known is None or signed.tree_size > known.tree_size:
            _signed_here[db] = signed


def sign_if_new(db: Database, log_key: SigningKey, origin: str) -> StoredCheckpoint | None:
    """Sign a checkpoint of the current tree if it has grown; return the latest checkpoint."""
    mine = _signed_here.get(db)
    with db.write() as s:
        size = log.log_size(s)
        last = latest_in(s)
        if size == 0 or (last is not None and last.tree_size >= size):
            return last
        if mine is not None and mine.tree_size >= size:
            if mine.tree_size > size:  # the log is smaller than a tree signed here: sign nothing
                return last
            _insert(s, mine)  # this tree's row was deleted: the note signed for it, again
            return mine
        root = tree.root(s, size)
        previous = max(last.tree_size if last is not None else 0, mine.tree_size if mine else 0)
        chained = (previous_line(previous),) if previous else ()
        # Taken under the append lock, after every leaf of the tree was appended: the note's
        # signed time is no earlier than any of theirs, and no later than any leaf after it.
        at = utcnow()
        note = sign_checkpoint(
            Checkpoint(origin, size, root, signed_at=at, extensions=chained), log_key
        )
        signed = StoredCheckpoint(size, root, note, at)
        _insert(s, signed)
    _remember(db, signed)
    return signed


def _insert(s: Session, cp: StoredCheckpoint) -> None:
    s.execute(
        insert(CheckpointRow),
        [
            {
                "tree_size": cp.tree_size,
                "root_hash": cp.root_hash,
                "note": cp.note,
                "signed_at": cp.signed_at,
            }
        ],
    )


def covering(db: Database, log_key: SigningKey, origin: str, index: int) -> StoredCheckpoint:
    """The latest checkpoint, signing a new one first if it does not yet cover ``index``."""
    with db.read() as s:
        cp = latest_in(s)
    if cp is None or cp.tree_size <= index:
        cp = sign_if_new(db, log_key, origin)
    if cp is None or cp.tree_size <= index:
        raise NotFound(f"log entry {index} does not exist", code="entry_not_found")
    return cp


def check_tree_size(session: Session, tree_size: int) -> None:
    size = log.log_size(session)
    if tree_size > size:
        raise InvalidInput(
            f"tree size {tree_size} exceeds the log's size {size}", code="invalid_tree_size"
        )


def history(db: Database, limit: int = 50) -> list[StoredCheckpoint]:
    """The latest ``limit`` rows, newest first, as stored: their notes are what is signed,
    and a reader shows a row only once its note verifies and :func:`disagreement` finds
    nothing (the console marks the others invalid)."""
    with db.read() as s:
        rows = s.execute(
            select(CheckpointRow).order_by(CheckpointRow.tree_size.desc()).limit(limit)
        ).scalars()
        return [_row(r) for r in rows]
