"""Which relation each Postgres role reads when a query names a ledger table unqualified.

The ledger's queries name their tables without a schema, so Postgres finds each by the
connecting role's ``search_path``: the first schema on it that holds a relation of that name.
A superuser who puts a view called ``records`` in a schema the ledger's role searches first
(a schema named after the role is on the default path, ``"$user", public``; or
``ALTER ROLE ... SET search_path``) changes every answer the server gives, while the tables,
their rows and their triggers (and an auditor connecting as another role) see nothing
changed. The same holds for functions and operators: one in a schema ahead of
``pg_catalog``, or behind it with argument types that match better.

:func:`paths` computes each login role's path as Postgres would at login: the first of its
settings for this database, its own settings, this database's settings, ``ALTER ROLE ALL``'s,
else the server's default (its command line's, else its configuration files', else the
built-in one); ``$user`` is the role its sessions act as (its ``role`` setting, else
itself), and ``pg_catalog`` comes first unless the path places it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

_SETTINGS = text(
    "SELECT r.rolname, s.setdatabase <> 0 AS in_database, s.setconfig "
    "FROM pg_db_role_setting s LEFT JOIN pg_roles r ON r.oid = s.setrole "
    "WHERE s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))"
)
# Sources under which this session's reset value of a setting is the server's own.
_SERVER_SOURCES = ("default", "configuration file", "command line", "environment variable")
# What a role needs to read the server's default path when it has a path of its own.
READ_SERVER_DEFAULT = (
    "GRANT SELECT ON pg_file_settings TO <role>; GRANT EXECUTE ON FUNCTION "
    "pg_show_all_file_settings(), pg_read_file(text) TO <role>"
)
_NAMEDATALEN = 63  # bytes of a name Postgres keeps
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class RolePath:
    role: str  # the login role
    acting: str  # the role its sessions act as (its ``role`` setting), whose privileges apply
    schemas: tuple[str, ...]  # in search order, pg_catalog included where it is searched


class UnknownDefault(Exception):
    """The server's default ``search_path`` cannot be read from this session."""


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
            name = value[start:i].strip().translate(_ASCII_LOWER)  # Postgres folds ASCII only
        names.append(name.encode()[:_NAMEDATALEN].decode("utf-8", "ignore"))
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
    """Each login role's search path in this database. Raises :class:`UnknownDefault` when a
    role without a setting of its own takes the server's default and this session cannot
    read it."""
    # Postgres applies, highest first: the role's setting in this database, the role's, the
    # database's, then ALTER ROLE ALL's; below them all the server's.
    scoped: dict[tuple[str | None, bool], dict[str, str]] = {}
    for row in conn.execute(_SETTINGS):
        scoped[row.rolname, row.in_database] = _settings(row.setconfig)
    server: str | UnknownDefault | None = None
    for (role,) in conn.execute(text("SELECT rolname FROM pg_roles WHERE rolcanlogin")).all():
        chain = [
            scoped.get(key, {})
            for key in ((role, True), (role, False), (None, True), (None, False))
        ]
        acting = next((c["role"] for c in chain if "role" in c), "none")
        acting = role if acting.lower() == "none" else acting
        value = next((c["search_path"] for c in chain if "search_path" in c), None)
        if value is None:
            if server is None:
                server = _server_default(conn)
            if isinstance(server, UnknownDefault):
                raise server
            value = server
        yield RolePath(role, acting, searched(value, acting))


def _settings(config: list[str] | None) -> dict[str, str]:
    found = {}
    for entry in config or ():
        name, _, value = entry.partition("=")
        if name.lower() in ("search_path", "role"):
            found[name.lower()] = value
    return found


def _server_default(conn: Connection) -> str | UnknownDefault:
    """The path a role without settings gets: this session's reset value where the server set
    it; else the command line's (:func:`_command_line`), else the configuration files'
    (readable by a superuser, or a role granted :data:`READ_SERVER_DEFAULT`)."""
    row = conn.execute(
        text("SELECT reset_val, boot_val, source FROM pg_settings WHERE name = 'search_path'")
    ).one()
    if row.source in _SERVER_SOURCES:
        return str(row.reset_val)
    readable = conn.execute(
        text(
            "SELECT has_table_privilege('pg_file_settings', 'SELECT') "
            "AND has_function_privilege('pg_show_all_file_settings()', 'EXECUTE') "
            "AND has_function_privilege('pg_read_file(text)', 'EXECUTE')"
        )
    ).scalar_one()
    if not readable:
        return UnknownDefault(
            f"this connection's own search_path comes from a {row.source} setting, so the "
            "server's default (the path of every role without a setting) is not its reset "
            "value, and it may not read both the configuration files (pg_file_settings) and "
            "the server's command line (postmaster.opts): audit as a role without a "
            f"search_path setting, or grant it what reading them takes: {READ_SERVER_DEFAULT}"
        )
    given = _command_line(conn)
    if given is not None:  # the server's command line overrides its configuration files
        return given
    filed = conn.execute(
        text(
            "SELECT setting FROM pg_file_settings WHERE name = 'search_path' AND applied "
            "ORDER BY seqno DESC LIMIT 1"
        )
    ).scalar()
    return str(filed if filed is not None else row.boot_val)


def _command_line(conn: Connection) -> str | UnknownDefault | None:
    """The ``search_path`` the server's command line sets (``postgres -c search_path=...``),
    from ``postmaster.opts`` in its data directory; None when it sets none."""
    try:
        with conn.begin_nested():  # a failed read fails this statement, not the session
            opts = conn.execute(text("SELECT pg_read_file('postmaster.opts')")).scalar_one()
    except DBAPIError as exc:
        said = str(exc.orig).strip() if exc.orig is not None else str(exc)
        return UnknownDefault(f"the server's command line (postmaster.opts) cannot be read: {said}")
    try:
        return command_line_setting(str(opts), "search_path")
    except ValueError as exc:
        return UnknownDefault(str(exc))


# The postmaster's options that take an argument (its getopt string, Postgres 13-17:
# "B:bC:c:D:d:EeFf:h:ijk:lN:nOPp:r:S:sTt:W:-:"); ``-c`` and ``--`` carry ``name=value``.
_WITH_ARGUMENT = frozenset("BCcDdfhkNprStW-")


def command_line_setting(opts: str, name: str) -> str | None:
    """The value the postmaster's command line gives setting ``name``, as Postgres reads it:
    ``-c name=value``, ``-cname=value``, ``--name=value``, or ``c`` bundled after flags
    (``-Fc name=value``), dashes in the name read as underscores, case ignored, the last one
    winning. ``opts`` is ``postmaster.opts``: the program, then each argument in double
    quotes, unescaped (``CreateOptsFile``); ValueError when it is not that."""
    line = opts.removesuffix("\n")
    at = line.find(' "')
    if at >= 0 and not line.endswith('"'):
        raise ValueError(f"postmaster.opts is not as the postmaster writes it: {opts!r}")
    args = [] if at < 0 else line[at + 2 : -1].split('" "')
    found = None
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            break  # the end of the options
        if not arg.startswith("-") or arg == "-":
            continue  # not an option (the postmaster refuses one; getopt passes it over)
        for j, letter in enumerate(arg[1:], start=2):
            if letter not in _WITH_ARGUMENT:
                continue  # a flag: the next letter is another option
            if j < len(arg):
                value = arg[j:]
            elif i < len(args):
                value, i = args[i], i + 1
            else:
                break
            key, sep, given = value.partition("=")
            if letter in "c-" and sep and key.replace("-", "_").lower() == name:
                found = given
            break
    return found
