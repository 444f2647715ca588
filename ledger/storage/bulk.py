"""Bulk inserts for the append path: binary ``COPY`` on Postgres, ``executemany`` elsewhere.

An ingest batch writes a few thousand small rows (log entries, Merkle nodes, record and
cache-key index rows). Row by row through ``INSERT``, Postgres parses, plans and executes
each statement and the driver encodes each one; ``COPY ... FROM STDIN (FORMAT BINARY)`` streams
them in one statement, inside the caller's transaction, with the same constraints, foreign
keys and triggers applied. It runs inside a ``Database.write()`` transaction, whose
``translated_errors`` turns driver errors into ledger errors as it does SQLAlchemy's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Table,
    insert,
)
from sqlalchemy.orm import Session
from sqlalchemy.types import TypeEngine

from ledger.storage.models import Base


def insert_rows(
    session: Session, model: type[Base], columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    """Insert ``rows`` (tuples in ``columns`` order) into ``model``'s table, in the session's
    transaction (one of ``Database.write()``)."""
    if not rows:
        return
    table = model.__table__
    assert isinstance(table, Table)
    if session.get_bind().dialect.name != "postgresql":
        session.execute(insert(table), [dict(zip(columns, row, strict=True)) for row in rows])
        return
    types = [_copy_type(table.c[name].type) for name in columns]
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(table.name), sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    conn = session.connection().connection.driver_connection
    assert isinstance(conn, psycopg.Connection)
    with conn.cursor() as cur, cur.copy(statement) as copy:
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)


def _copy_type(column_type: TypeEngine[Any]) -> str:
    """The Postgres type name whose binary format ``COPY`` expects for a column."""
    if isinstance(column_type, BigInteger):
        return "int8"
    if isinstance(column_type, SmallInteger):
        return "int2"
    if isinstance(column_type, Integer):
        return "int4"
    if isinstance(column_type, Boolean):
        return "bool"
    if isinstance(column_type, String):  # varchar(n) and text share the binary format
        return "text"
    if isinstance(column_type, LargeBinary):
        return "bytea"
    if isinstance(column_type, DateTime):
        return "timestamptz" if column_type.timezone else "timestamp"
    raise TypeError(f"no COPY type for column type {column_type!r}")
