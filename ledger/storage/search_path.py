"""Which relation each Postgres role reads when a query names a ledger table unqualified.

The ledger's queries name their tables without a schema, so Postgres finds each by the
connecting role's ``search_path``: the first schema on it that holds a relation of that name.
A superuser who puts a view called ``records`` in a schema the ledger's role searches first
(a schema named after the role is on the default path, ``"$user", public``; or
``ALTER ROLE ... SET search_path``) changes every answer the server gives, while the tables,
their rows and their triggers (and an auditor connecting as another role) see nothing
changed. The same holds for functions and operators when a path names ``pg_catalog`` after
another schema.

:func:`paths` computes each login role's path as Postgres would at login: the first of its
settings for this database, its own settings, this database's settings, else the server's
default, with ``$user`` as the role's name and ``pg_catalog`` first unless the path places it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import Connection, text

_SETTINGS = text(
    "SELECT r.rolname, s.setdatabase <> 0 AS in_database, s.setconfig "
    "FROM pg_db_role_setting s LEFT JOIN pg_roles r ON r.oid = s.setrole "
    "WHERE s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))"
)


@dataclass(frozen=True)
class RolePath:
    role: str
    schemas: tuple[str, ...]  # in search order, pg_catalog included where it is searched


def split(value: str) -> list[str]:
    """A ``search_path`` value as Postgres splits it: comma-separated names, unquoted ones
    folded to lower case, ``"..."`` kept as written with ``""`` for a quote."""
    names: list[str] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i] in " \t\n\r":
            i += 1
        if i < n and value[i] == '"':
            name, i = "", i + 1
            while i < n:
                if value[i] == '"':
                    if value[i + 1 : i + 2] == '"':
                        name, i = name + '"', i + 2
                        continue
                    i += 1
                    break
                name, i = name + value[i], i + 1
        else:
            start = i
            while i < n and value[i] != ",":
                i += 1
            name = value[start:i].strip().lower()
        names.append(name)
        while i < n and value[i] != ",":
            i += 1
        i += 1
    return [name for name in names if name]


def searched(value: str, role: str) -> tuple[str, ...]:
    """The schemas ``role`` searches, in order, under the path ``value``."""
    schemas = [role if name == "$user" else name for name in split(value)]
    schemas = [name for name in schemas if name != "pg_temp"]  # a session's own objects
    if "pg_catalog" not in schemas:
        schemas.insert(0, "pg_catalog")
    return tuple(dict.fromkeys(schemas))


def paths(conn: Connection) -> Iterator[RolePath]:
    """Each login role's search path in this database."""
    per_role: dict[str, dict[bool, str]] = {}
    database: str | None = None
    for row in conn.execute(_SETTINGS):
        value = _search_path(row.setconfig)
        if value is None:
            continue
        if row.rolname is None:
            database = value
        else:
            per_role.setdefault(row.rolname, {})[row.in_database] = value
    server = _server_default(conn)
    for (role,) in conn.execute(text("SELECT rolname FROM pg_roles WHERE rolcanlogin")):
        own = per_role.get(role, {})
        value = own.get(True) or own.get(False) or database or server
        yield RolePath(role, searched(value, role))


def _search_path(config: list[str] | None) -> str | None:
    for entry in config or ():
        name, _, value = entry.partition("=")
        if name.lower() == "search_path":
            return value
    return None


def _server_default(conn: Connection) -> str:
    """The path a role without settings gets: the server's configured value where this
    session has not changed it (its reset value then is the server's), else the built-in."""
    row = conn.execute(
        text("SELECT reset_val, boot_val, source FROM pg_settings WHERE name = 'search_path'")
    ).one()
    return str(row.reset_val if row.source in ("default", "configuration file") else row.boot_val)
