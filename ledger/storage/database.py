"""Database factory: one engine per URL, SQLite tuned for durability, writes serialized."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DataError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from ledger.errors import Conflict, InvalidInput, StorageError

logger = logging.getLogger("ledger.storage")

# Advisory lock key that serializes appends to the log on Postgres (one sequencer).
APPEND_LOCK_KEY = 0x1ED6E12


def normalize_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` URLs and select the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def sqlite_file(url: str) -> Path | None:
    """The file an SQLite URL names (None: not SQLite, in memory, or not a URL)."""
    try:
        parsed = make_url(normalize_url(url))
    except (ArgumentError, ValueError):
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


_latest = datetime.min.replace(tzinfo=UTC)
_latest_lock = threading.Lock()


def utcnow() -> datetime:
    """Now, and never earlier than a time this process read before: a clock stepped back (an
    NTP correction) would give a leaf or a checkpoint a time before the one logged ahead of
    it, which the audit reports as a tampered time. The time then stands still until the
    clock catches up."""
    global _latest
    now = datetime.now(UTC)
    with _latest_lock:
        if now < _latest:
            return _latest
        _latest = now
    return now


def as_utc(value: datetime) -> datetime:
    """SQLite returns naive datetimes; every time the ledger hands out is aware UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# (dialect, driver) pairs the ledger runs on: its triggers and migrations are written for these
_STORES = {("sqlite", "pysqlite"), ("postgresql", "psycopg")}


class Database:
    """Owns the engine. ``write()`` transactions are serialized across processes."""

    def __init__(self, url: str, *, pool_size: int = 5) -> None:
        self.url = normalize_url(url)
        try:
            parsed = make_url(self.url)
        except (ArgumentError, ValueError) as exc:
            raise InvalidInput(f"not a database URL: {url!r}", code="invalid_database_url") from exc
        try:
            store = (parsed.get_backend_name(), parsed.get_driver_name())
        except ArgumentError:  # NoSuchModuleError: a scheme SQLAlchemy does not know
            store = ("", "")
        self.dialect = store[0]
        if store not in _STORES:
            raise InvalidInput(
                f"the ledger keeps its log in SQLite (sqlite:///PATH) or Postgres "
                f"(postgresql://USER@HOST/DB), not {parsed.drivername}",
                code="invalid_database_url",
            )
        kwargs: dict[str, Any] = {"future": True}
        if self.dialect == "sqlite":
            if parsed.database and parsed.database != ":memory:":
                try:
                    Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise InvalidInput(
                        f"cannot make the directory of {parsed.database}: {exc.strerror}",
                        code="invalid_database_url",
                    ) from exc
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            # No pre-ping round trip per checkout: a connection the server dropped fails once
            # (503 storage_error, Retry-After) and the pool is invalidated and refilled.
            kwargs.update(pool_size=pool_size, max_overflow=10, pool_recycle=1800)
        try:
            self.engine: Engine = create_engine(self.url, **kwargs)
        except (SQLAlchemyError, ImportError, ValueError) as exc:
            raise StorageError(f"cannot open database {parsed!r}: {exc}") from exc
        if self.dialect == "sqlite":
            _tune_sqlite(self.engine)
        self._writer = self.engine.execution_options(ledger_write=True)
        # A read sees one moment on Postgres, as it does on SQLite (WAL): under READ COMMITTED
        # each statement would see its own, so a record's disclosures read before an erasure
        # committed and its erasure state read after it would disagree (a false index_mismatch).
        self._reader = (
            self.engine.execution_options(isolation_level="REPEATABLE READ")
            if self.dialect == "postgresql"
            else self.engine
        )

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    def describe(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only transaction over one snapshot of the database."""
        with translated_errors(), Session(self._reader, expire_on_commit=False) as s, s.begin():
            yield s

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A transaction that holds the ledger's append lock from its first statement."""
        with translated_errors(), Session(self._writer, expire_on_commit=False) as s, s.begin():
            if self.is_postgres:
                s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": APPEND_LOCK_KEY})
            else:  # BEGIN IMMEDIATE goes out with the first statement: take the lock now, so
                # a time read next (a leaf's) is read after every earlier writer committed
                s.execute(text("SELECT 1"))
            yield s

    def ping(self) -> None:
        with translated_errors(), self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def scrub(self) -> bool:
        """After an erasure deleted content: on SQLite, copy the write-ahead log into the
        database file and cut the log to zero bytes, so no file of the ledger keeps the frames
        that held what was deleted (``secure_delete`` zeroes it in the database file itself).
        False when that could not finish (a reader's snapshot still needs the log: SQLite's
        next checkpoint copies it, and the next erasure cuts it). Postgres keeps a deleted
        row until VACUUM reuses its space, and in its WAL and backups (docs/OPERATIONS.md):
        False there, nothing done."""
        if self.dialect != "sqlite":
            return False
        raw = self.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            row = cursor.fetchone()  # (busy, frames in the log, frames copied)
        except sqlite3.Error as exc:
            logger.warning("could not truncate the write-ahead log after an erasure: %s", exc)
            return False
        finally:
            raw.close()
        return row is not None and not row[0]

    def dispose(self) -> None:
        self.engine.dispose()


@contextmanager
def translated_errors() -> Iterator[None]:
    """Turn SQLAlchemy and driver errors into ledger errors at the storage boundary (psycopg's
    own come from code that uses it directly inside a session: COPY, binary cursors)."""
    try:
        yield
    except (IntegrityError, DataError, psycopg.IntegrityError, psycopg.DataError) as exc:
        # The request, not the database, is at fault: never answered as retryable.
        detail = getattr(exc, "orig", None) or exc
        refused = isinstance(exc, IntegrityError | psycopg.IntegrityError)
        cls = Conflict if refused else InvalidInput
        raise cls(f"the database refused the data: {detail}", code="rejected_by_database") from exc
    except (SQLAlchemyError, psycopg.Error) as exc:
        detail = getattr(exc, "orig", None) or exc
        if _guard_refusal(detail):  # as SQLite's triggers answer: a refusal, not a failure
            raise Conflict(
                f"the database refused the data: {detail}", code="rejected_by_database"
            ) from exc
        raise StorageError(f"database error: {type(detail).__name__}: {detail}") from exc


def _guard_refusal(error: object) -> bool:
    """Whether a Postgres error is one of the ledger's own table guards refusing a change
    (``migrations/append_only.py``, 0009's erasure guard), whose messages start so."""
    return isinstance(error, psycopg.errors.InsufficientPrivilege) and str(error).startswith(
        "ledger table "
    )


def _tune_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event emit BEGIN so writers can take the lock up front.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        # What a DELETE removes (an erasure's disclosures and cache keys) is overwritten with
        # zeros in the file, not left in free pages; SQLite's default depends on its build.
        cur.execute("PRAGMA secure_delete=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get("ledger_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
