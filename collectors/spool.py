"""The collector's durable spool: every signed record is here before its response completes.

SQLite in WAL mode with ``synchronous=FULL``: a committed record survives the collector being
killed and the machine losing power. Writers hand records to one writer thread that commits
whatever has queued up in one transaction (group commit), so concurrent requests share an
fsync; a lone request commits on its own thread instead (:meth:`put_now`). A record leaves the
spool only when the ledger has acknowledged it (:meth:`ack`), or, when the ledger refuses it
for good (a conflicting duplicate, say), into ``dead_letters`` with the reason, where it stays
for an operator. Request IDs stay known for :data:`REQUEST_ID_RETENTION` after their record
left, so a reused one is refused. The write-ahead log is copied into the database only when
the shipper calls :meth:`checkpoint`, never inside a record's commit; once the log is past
:data:`WAL_SIZE_LIMIT`, the copy finishes with commits held back for its last frames, so that
the log starts over however steady the load (it and its index would grow without end).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import Conflict, LedgerError, StorageError

logger = logging.getLogger("ledger.collector.spool")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS spool ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, request_id TEXT NOT NULL UNIQUE,"
    " envelope BLOB NOT NULL, spooled_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
    " last_error TEXT)",
    "CREATE TABLE IF NOT EXISTS fingerprints ("
    " fingerprint_id TEXT PRIMARY KEY, envelope BLOB NOT NULL, registered INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS dead_letters ("
    " seq INTEGER PRIMARY KEY, request_id TEXT NOT NULL, envelope BLOB NOT NULL,"
    " reason TEXT NOT NULL, failed_at REAL NOT NULL)",
    # Every request ID this collector recorded, shipped or not, for REQUEST_ID_RETENTION: the
    # ledger keys records by request ID, so a client reusing one is refused before the engine
    # runs, rather than its record being refused by the ledger after the answer went out.
    "CREATE TABLE IF NOT EXISTS request_ids ("
    " request_id TEXT PRIMARY KEY, used_at REAL NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS request_ids_used_at ON request_ids (used_at)",
)
REQUEST_ID_RETENTION = 7 * 24 * 3600.0  # seconds a used request ID stays refused
# Bytes of records written between checkpoints: about SQLite's own automatic threshold (1,000
# pages), so the log is copied as seldom as before, only off the request's path.
CHECKPOINT_BYTES = 4 * 1024 * 1024
WAL_SIZE_LIMIT = 4 * CHECKPOINT_BYTES  # bytes the write-ahead log file keeps between bursts


@dataclass(frozen=True)
class Spooled:
    seq: int
    request_id: str
    envelope: bytes


class Spool:
    """Durable FIFO of canonical signed envelopes, keyed by request ID."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = self._connect()
            self._read = self._connect()
            self._lookup = self._connect()  # request ID checks, on the proxy's event loop
            self._page_size = int(self._conn.execute("PRAGMA page_size").fetchone()[0])
            # A spool from before the request_ids table: its pending records' IDs.
            self._conn.execute(
                "INSERT OR IGNORE INTO request_ids SELECT request_id, spooled_at FROM spool"
            )
        except (sqlite3.Error, OSError) as exc:  # read-only, a directory in the way, ...
            raise StorageError(f"cannot open the spool {self.path}: {exc}") from exc
        self._queue: list[tuple[str, bytes, Future[None]]] = []
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()  # one transaction at a time on the write connection
        self._closed = False
        self._written = 0  # bytes of records committed since the last checkpoint
        self.added = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="spool-writer", daemon=True)
        self._writer.start()

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=10000")
            # A shipped or expired record's content is overwritten with zeros where it lay,
            # not left in free pages for a later erasure in the ledger not to reach.
            conn.execute("PRAGMA secure_delete=ON")
            # Checkpoints run on the shipper's thread (checkpoint()), never in a commit on a
            # request's path: a multi-megabyte one would hold up the proxy's event loop.
            conn.execute("PRAGMA wal_autocheckpoint=0")
            # Once a checkpoint has copied the log and it starts over, SQLite cuts the file
            # back to this size, so a burst does not leave a write-ahead log that size forever.
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            for statement in _SCHEMA:
                conn.execute(statement)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the spool {self.path}: {exc}") from exc
        return conn

    # -- writing -------------------------------------------------------------------------

    def put(self, request_id: str, envelope: bytes, timeout: float = 30.0) -> None:
        """Store one record durably; returns once it is committed."""
        self.submit(request_id, envelope).result(timeout)

    def submit(self, request_id: str, envelope: bytes) -> Future[None]:
        """Queue one record; the future resolves once it is committed (or fails)."""
        done: Future[None] = Future()
        with self._cond:
            if self._closed:
                raise StorageError("the spool is closed")
            self._queue.append((request_id, envelope, done))
            self._cond.notify()
        return done

    def put_now(self, request_id: str, envelope: bytes) -> bool:
        """Commit one record on the caller's thread, if nothing else is being written.

        Returns False, having done nothing, when a write is queued or running (or the spool
        is closed): the caller then hands it to the writer (:meth:`submit`). With one request in
        flight this skips two thread hand-offs (to the writer and back: ~0.3 ms on a CPU shared
        with a busy engine, docs/PERFORMANCE.md); under load the writer's group commit, which
        shares one fsync among many records, is the better path. Raises what the commit
        raised: :class:`Conflict` for a request ID already used, else :class:`StorageError`.
        """
        with self._cond:
            if self._queue or self._closed:
                return False
        if not self._write_lock.acquire(blocking=False):
            return False
        try:
            (error,) = self._commit([(request_id, envelope)])
        finally:
            self._write_lock.release()
        self.added.set()
        if error is not None:
            raise error
        return True

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue and self._closed:
                    return
                batch, self._queue = self._queue, []
            # A waiter that gave up (its asyncio task was cancelled: a client gone mid-stream)
            # cancelled its future, and records its exchange another way; the others can no
            # longer be cancelled once marked running.
            batch = [item for item in batch if item[2].set_running_or_notify_cancel()]
            if not batch:
                continue
            results: list[LedgerError | None]
            try:
                with self._write_lock:
                    results = self._commit([(r, e) for r, e, _ in batch])
            except Exception as exc:  # the writer outlives any one batch, or every put hangs
                logger.exception("the spool's writer failed on a batch of %d", len(batch))
                results = [StorageError(f"the spool {self.path} failed: {exc}")] * len(batch)
            # Waiters wake once the write lock is free (a woken one may write at once).
            for (_, _, future), result in zip(batch, results, strict=True):
                if result is None:
                    future.set_result(None)
                else:
                    future.set_exception(result)
            self.added.set()

    def _commit(self, batch: list[tuple[str, bytes]]) -> list[LedgerError | None]:
        """Insert records in one transaction (the caller holds the write lock); per record,
        None or the error that kept it out. The whole batch goes in with two statements; only
        when a request ID in it was used already is it inserted again one by one, so that
        the others still go in."""
        now = time.time()
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(
                    "INSERT INTO spool (request_id, envelope, spooled_at) VALUES (?, ?, ?)",
                    [(request_id, envelope, now) for request_id, envelope in batch],
                )
                self._conn.executemany(
                    "INSERT INTO request_ids VALUES (?, ?)",
                    [(request_id, now) for request_id, _ in batch],
                )
                results: list[LedgerError | None] = [None] * len(batch)
            except sqlite3.IntegrityError:
                self._conn.execute("ROLLBACK")
                self._conn.execute("BEGIN IMMEDIATE")
                results = self._insert_each(batch, now)
            self._conn.execute("COMMIT")
            self._written += sum(len(envelope) for _, envelope in batch)
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            results = [StorageError(f"the spool {self.path} failed: {exc}")] * len(batch)
        return results

    def _insert_each(self, batch: list[tuple[str, bytes]], now: float) -> list[LedgerError | None]:
        """The batch's records one by one, each in a savepoint: a used request ID is refused
        alone (inside the caller's transaction)."""
        results: list[LedgerError | None] = []
        for request_id, envelope in batch:
            try:
                self._conn.execute("SAVEPOINT one")
                self._conn.execute(
                    "INSERT INTO spool (request_id, envelope, spooled_at) VALUES (?, ?, ?)",
                    (request_id, envelope, now),
                )
                self._conn.execute("INSERT INTO request_ids VALUES (?, ?)", (request_id, now))
                self._conn.execute("RELEASE one")
                results.append(None)
            except sqlite3.IntegrityError:
                self._conn.execute("ROLLBACK TO one")
                self._conn.execute("RELEASE one")
                results.append(
                    Conflict(
                        f"request ID {request_id!r} was already used with this collector",
                        code="request_id_in_use",
                    )
                )
        return results

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction on the write connection, rolled back if any of it fails (a
        transaction left open would fail every later commit)."""
        with self._write_lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def checkpoint(self, at_least: int | None = None) -> bool:
        """Copy the write-ahead log into the database once ``at_least`` bytes of records
        (default :data:`CHECKPOINT_BYTES`) were committed since the last copy (the shipper's
        thread calls this between batches)."""
        if self._written < (CHECKPOINT_BYTES if at_least is None else at_least):
            return False
        try:
            _, frames, _ = self._read.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if frames * self._page_size > WAL_SIZE_LIMIT:
                # SQLite starts the log over only at a commit that finds all of it copied.
                # Under steady load a commit lands during every copy, so the log would grow
                # for as long as records keep coming. Copy the rest with commits held back:
                # the copy above did the bulk, this waits only for what came meanwhile.
                with self._write_lock:
                    self._read.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.OperationalError:
            # Busy or locked (another statement on this connection, or another process's
            # reader): the copy is only an optimisation; SQLite keeps the log, so try later.
            return False
        self._written = 0
        return True

    # -- shipping ------------------------------------------------------------------------

    def oldest(self, limit: int) -> list[Spooled]:
        rows = self._read.execute(
            "SELECT seq, request_id, envelope FROM spool ORDER BY seq LIMIT ?", (limit,)
        ).fetchall()
        return [Spooled(int(s), str(r), bytes(e)) for s, r, e in rows]

    def ack(self, seqs: list[int]) -> None:
        """The ledger holds these records: forget them."""
        if not seqs:
            return
        with self._transaction() as conn:
            conn.executemany("DELETE FROM spool WHERE seq = ?", [(s,) for s in seqs])

    def failed(self, seqs: list[int], error: str) -> None:
        with self._transaction() as conn:
            conn.executemany(
                "UPDATE spool SET attempts = attempts + 1, last_error = ? WHERE seq = ?",
                [(error, s) for s in seqs],
            )

    def dead_letter(self, item: Spooled, reason: str) -> None:
        """The ledger refuses this record for good: keep it aside for an operator."""
        with self._transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO dead_letters VALUES (?, ?, ?, ?, ?)",
                (item.seq, item.request_id, item.envelope, reason, time.time()),
            )
            conn.execute("DELETE FROM spool WHERE seq = ?", (item.seq,))

    def add_fingerprint(self, fingerprint_id: str, envelope: bytes) -> None:
        """Keep a fingerprint until the ledger has it: records under it ship only after."""
        with self._write_lock:
            self._conn.execute(
                "INSERT OR IGNORE INTO fingerprints VALUES (?, ?, 0)", (fingerprint_id, envelope)
            )
        self.added.set()

    def unregistered_fingerprints(self) -> list[tuple[str, bytes]]:
        rows = self._read.execute(
            "SELECT fingerprint_id, envelope FROM fingerprints WHERE registered = 0"
        ).fetchall()
        return [(str(f), bytes(e)) for f, e in rows]

    def fingerprint_registered(self, fingerprint_id: str) -> None:
        with self._write_lock:
            self._conn.execute(
                "UPDATE fingerprints SET registered = 1 WHERE fingerprint_id = ?",
                (fingerprint_id,),
            )

    def reregister_fingerprint(self, fingerprint_id: str) -> bool:
        """The ledger lacks a fingerprint marked registered: post it again (idempotent).
        False if this spool never had it."""
        with self._write_lock:
            cursor = self._conn.execute(
                "UPDATE fingerprints SET registered = 0 WHERE fingerprint_id = ?",
                (fingerprint_id,),
            )
        return cursor.rowcount > 0

    def holds(self, request_id: str) -> bool:
        """Whether this request ID was used here (within the retention, or still pending)."""
        row = self._lookup.execute(
            "SELECT 1 FROM request_ids WHERE request_id = ?"
            " UNION ALL SELECT 1 FROM spool WHERE request_id = ? LIMIT 1",
            (request_id, request_id),
        ).fetchone()
        return row is not None

    def forget_request_ids(self, used_before: float, chunk: int = 2_000) -> int:
        """Forget request IDs used before ``used_before`` (a Unix time), in short transactions
        so that recording is never held up for long; pending records' IDs stay refused."""
        forgotten = 0
        while True:
            with self._write_lock:
                gone = self._conn.execute(
                    "DELETE FROM request_ids WHERE request_id IN (SELECT request_id FROM"
                    " request_ids WHERE used_at < ? LIMIT ?)",
                    (used_before, chunk),
                ).rowcount
            forgotten += gone
            if gone < chunk:
                return forgotten

    def expire_content(self, older_than: float) -> tuple[int, int]:
        """Delete records spooled before ``older_than`` (a Unix time): pending ones and dead
        letters, which hold prompts and outputs (``LEDGER_CONTENT_RETENTION_DAYS``). Returns
        (pending, dead letters) deleted. Their request IDs stay remembered, so none is reused."""
        with self._transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO request_ids (request_id, used_at) "
                "SELECT request_id, spooled_at FROM spool WHERE spooled_at < ?",
                (older_than,),
            )
            pending = conn.execute("DELETE FROM spool WHERE spooled_at < ?", (older_than,)).rowcount
            dead = conn.execute(
                "DELETE FROM dead_letters WHERE failed_at < ?", (older_than,)
            ).rowcount
        if pending or dead:
            self._cut_log()
        return pending, dead

    def _cut_log(self) -> None:
        """Copy the write-ahead log into the spool and cut it to zero bytes: its frames still
        hold what was just deleted. Commits are held back meanwhile; a reader in the way
        leaves it to the next purge (SQLite then copies the log at its next checkpoint)."""
        with self._write_lock:
            try:
                self._read.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.OperationalError:
                return
        self._written = 0

    def pending(self) -> int:
        return int(self._read.execute("SELECT count(*) FROM spool").fetchone()[0])

    def dead_letters(self) -> int:
        return int(self._read.execute("SELECT count(*) FROM dead_letters").fetchone()[0])

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._writer.join(timeout=30)
        self._conn.close()
        self._read.close()
        self._lookup.close()
