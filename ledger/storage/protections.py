"""Whether the database still enforces what the ledger's migrations installed.

The append-only triggers do not make the log trustworthy (``ledger audit`` does), but a
database superuser can also change what the application *reads* without changing a row:
row-level security with a policy hides a logged record from the ledger's role only, a rule
rewrites a query, a trigger function replaced by one that lets an UPDATE through turns the
guard off without ``DISABLE TRIGGER``, a view named ``records`` in a schema the server's
role searches first answers in the table's place (:mod:`ledger.storage.search_path`), a table
that inherits from a ledger table adds its rows to every query of it, and a column default
fills what an insert leaves out. None of these edits a row, so no check of the rows sees
them; :func:`problems` reads the catalog for each, and the audit reports what it finds.

Expected, per ledger table: on Postgres a ``{table}_append_only`` row trigger (calling
``ledger_delete_only_erased()`` for the two tables erasure deletes from, else
``ledger_refuse_mutation()``) and a ``{table}_no_truncate`` statement trigger, both enabled
ALWAYS, the two functions as the migrations wrote them, no row-level security, no policy,
no rule, no column default, identity or generated column and no inheritance; every login
role that may read the table (as itself, or as the role its ``role`` setting names) finds
this schema's table by its name first, and no schema on its path but ``pg_catalog`` holds an
operator or a function named as a built-in one; pg_catalog holds nothing added after initdb
(but language handlers) and no cast was added between built-in types; no login event
trigger (Postgres 17). Other event triggers fire on DDL, and what one could change is catalog
state these checks read. A superuser who edits the catalog's rows directly (UPDATE pg_proc)
is beyond them.

On SQLite the ``{table}_no_update`` trigger and a ``{table}_no_delete`` (or
``{table}_erasure_only``) trigger.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import Connection, text

from ledger.storage import search_path
from ledger.storage.models import APPEND_ONLY_TABLES, ERASABLE_TABLES

TABLES = APPEND_ONLY_TABLES + ERASABLE_TABLES

REFUSE = "ledger_refuse_mutation"
ERASED_ONLY = "ledger_delete_only_erased"
# SHA-256 of each function's source (prosrc, blank lines and spaces trimmed at both ends), as
# revisions 0002 and 0009 create them.
FUNCTION_SOURCES = {
    REFUSE: "788dab18e60ae5ad1aa5c5208c4140f8f9afe206ea84ee66ea69a8e84e53a549",
    ERASED_ONLY: "fd72dad17b049762ee22e42637c01f46d6bfa527affddd7b817cc2fc3f909f37",
}


def problems(conn: Connection) -> list[tuple[str | None, str]]:
    """(table or None, what is wrong) for every protection the database does not hold."""
    if conn.dialect.name == "postgresql":
        return _postgres(conn)
    if conn.dialect.name == "sqlite":
        return _sqlite(conn)
    return []


# pg_trigger.tgtype bits: ROW 1, BEFORE 2, DELETE 8, UPDATE 16, TRUNCATE 32
_ROW_GUARD = 1 | 2 | 8 | 16  # BEFORE UPDATE OR DELETE, FOR EACH ROW
_TRUNCATE_GUARD = 2 | 32  # BEFORE TRUNCATE, FOR EACH STATEMENT


def _postgres(conn: Connection) -> list[tuple[str | None, str]]:
    found: list[tuple[str | None, str]] = []
    # By name (pg_namespace), not a regnamespace cast, which folds "Ledger" to ledger.
    in_schema = "n.nspname = :schema AND c.relname = ANY(:tables)"
    tables = {"tables": list(TABLES), "schema": conn.execute(_LEDGER_SCHEMA).scalar_one()}
    triggers = {
        (row.relname, row.tgname): row
        for row in conn.execute(
            text(
                "SELECT c.relname, t.tgname, t.tgenabled, t.tgtype, t.tgqual IS NOT NULL AS "
                "conditional, p.prosrc FROM pg_trigger t "
                "JOIN pg_class c ON c.oid = t.tgrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "JOIN pg_proc p ON p.oid = t.tgfoid "
                f"WHERE NOT t.tgisinternal AND {in_schema}"
            ),
            tables,
        )
    }
    for table in TABLES:
        guard = ERASED_ONLY if table in ERASABLE_TABLES else REFUSE
        for name, function, kind in (
            (f"{table}_append_only", guard, _ROW_GUARD),
            (f"{table}_no_truncate", REFUSE, _TRUNCATE_GUARD),
        ):
            found += [
                (table, f"trigger {name} {p}")
                for p in _trigger(triggers.get((table, name)), function, kind)
            ]
    for row in conn.execute(
        text(
            "SELECT c.relname, c.relrowsecurity, "
            "(SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid) AS policies, "
            "(SELECT count(*) FROM pg_rewrite r WHERE r.ev_class = c.oid) AS rules "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE {in_schema} ORDER BY c.relname"
        ),
        tables,
    ):
        if row.relrowsecurity or row.policies:
            found.append(
                (
                    row.relname,
                    f"row-level security is on or {row.policies} policies are set on "
                    f"{row.relname}: the rows a role reads may not be the table's",
                )
            )
        if row.rules:
            found.append((row.relname, f"{row.rules} rules rewrite queries on {row.relname}"))
    for row in conn.execute(
        text("SELECT evtname FROM pg_event_trigger WHERE evtevent = 'login' AND evtenabled <> 'D'")
    ):
        found.append(
            (
                None,
                f"event trigger {row.evtname} runs at every login: it can set a session's "
                "search_path, or make temporary objects that answer for the ledger's tables",
            )
        )
    found += _defaults(conn, tables) + _inheritance(conn, tables) + _catalog_additions(conn)
    return found + _own_lookup(conn, tables) + _name_lookup(conn, tables)


def _defaults(conn: Connection, tables: dict[str, Any]) -> list[tuple[str | None, str]]:
    """The migrations give no ledger column a default, an identity or a generated value: one
    set fills, or computes, what an insert writes."""
    found: list[tuple[str | None, str]] = []
    for row in conn.execute(
        text(
            "SELECT c.relname, a.attname, pg_get_expr(d.adbin, d.adrelid) AS expr, "
            "a.attidentity, a.attgenerated FROM pg_attribute a "
            "JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
            "WHERE n.nspname = :schema AND c.relname = ANY(:tables) AND a.attnum > 0 "
            "AND NOT a.attisdropped "
            "AND (d.oid IS NOT NULL OR a.attidentity <> '' OR a.attgenerated <> '') "
            "ORDER BY c.relname, a.attnum"
        ),
        tables,
    ):
        column = f"{row.relname}.{row.attname}"
        if row.attidentity:
            what = "is an identity column"
        elif row.attgenerated:
            what = f"is generated ({row.expr})"
        else:
            what = f"has a default ({row.expr})"
        found.append(
            (
                row.relname,
                f"column {column} {what}, which the migrations did not make: it fills what an "
                "insert leaves out",
            )
        )
    return found


def _inheritance(conn: Connection, tables: dict[str, Any]) -> list[tuple[str | None, str]]:
    """A child table's rows are read by every query of its parent (and a ledger table made
    a child reads as its parent's part)."""
    found: list[tuple[str | None, str]] = []
    for row in conn.execute(
        text(
            "SELECT pc.relname AS parent, pn.nspname AS parent_schema, cc.relname AS child, "
            "cn.nspname AS child_schema, pn.nspname = :schema "
            "AND pc.relname = ANY(:tables) AS ledger_parent FROM pg_inherits i "
            "JOIN pg_class pc ON pc.oid = i.inhparent "
            "JOIN pg_namespace pn ON pn.oid = pc.relnamespace "
            "JOIN pg_class cc ON cc.oid = i.inhrelid "
            "JOIN pg_namespace cn ON cn.oid = cc.relnamespace "
            "WHERE (pn.nspname = :schema AND pc.relname = ANY(:tables)) "
            "OR (cn.nspname = :schema AND cc.relname = ANY(:tables)) "
            "ORDER BY 1, 3"
        ),
        tables,
    ):
        parent, child = f"{row.parent_schema}.{row.parent}", f"{row.child_schema}.{row.child}"
        if row.ledger_parent:
            found.append(
                (
                    row.parent,
                    f"table {child} inherits from {row.parent}: every query of "
                    f"{row.parent} also reads its rows",
                )
            )
        else:
            found.append(
                (row.child, f"{row.child} inherits from {parent}: it is not a table of its own")
            )
    return found


# Objects made after initdb get OIDs from FirstNormalObjectId (16384) on, so any such object
# in pg_catalog, which every search path reaches first, was put there by a superuser: an
# operator = on varchar there answers a lookup by request ID in the built-in's place. So does
# a cast added between built-in types, wherever its function lives (casts have no schema).
# Language handlers are exempt: they run only functions of their language. The constants
# are cast to oid so no operator but the built-in (oid, oid) one can match.
_CATALOG_ADDITIONS = text(
    "SELECT 'function' AS what, p.oid::regprocedure::text AS name FROM pg_proc p "
    "WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.oid >= CAST(16384 AS oid) "
    "AND NOT EXISTS (SELECT 1 FROM pg_language l "
    "WHERE p.oid IN (l.lanplcallfoid, l.laninline, l.lanvalidator)) "
    "UNION ALL SELECT 'operator', o.oid::regoperator::text FROM pg_operator o "
    "WHERE o.oprnamespace = 'pg_catalog'::regnamespace AND o.oid >= CAST(16384 AS oid) "
    "UNION ALL SELECT 'type', t.oid::regtype::text FROM pg_type t "
    "WHERE t.typnamespace = 'pg_catalog'::regnamespace AND t.oid >= CAST(16384 AS oid) "
    "UNION ALL SELECT 'conversion', c.conname::text FROM pg_conversion c "
    "WHERE c.connamespace = 'pg_catalog'::regnamespace AND c.oid >= CAST(16384 AS oid) "
    "UNION ALL SELECT 'cast', c.castsource::regtype::text || ' AS ' || "
    "c.casttarget::regtype::text FROM pg_cast c WHERE c.oid >= CAST(16384 AS oid) "
    "AND c.castsource < CAST(16384 AS oid) AND c.casttarget < CAST(16384 AS oid) "
    "ORDER BY 1, 2"
)


def _catalog_additions(conn: Connection) -> list[tuple[str | None, str]]:
    """Objects a superuser added to pg_catalog, and casts added between built-in types."""
    found: list[tuple[str | None, str]] = []
    for row in conn.execute(_CATALOG_ADDITIONS):
        if row.what == "cast":
            found.append(
                (
                    None,
                    f"a cast ({row.name}) was added between built-in types: the ledger's "
                    "queries may resolve their operators and functions through it",
                )
            )
        else:
            found.append(
                (
                    None,
                    f"pg_catalog holds the {row.what} {row.name}, which Postgres did not "
                    "create there: every search path reaches pg_catalog first, so the "
                    "ledger's queries may use it in a built-in's place",
                )
            )
    return found


# The ledger's schema: where this connection finds the log (a shadow of every table, the log
# included, has no guard trigger, which the checks above name).
_LEDGER_SCHEMA = text(
    "SELECT coalesce((SELECT n.nspname FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('log_entries')), "
    "current_schema())"
)
_SHADOWS = text(
    "SELECT n.nspname, c.relname FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relname = ANY(:tables) AND c.relkind IN ('r', 'v', 'm', 'f', 'p') "
    "AND n.nspname <> :schema"
)
_READERS = text(  # every role, whether it is a superuser, and the ledger tables it may read
    "SELECT r.rolname, r.rolsuper, c.relname FROM pg_roles r CROSS JOIN pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = :schema AND c.relname = ANY(:tables) "
    "AND has_table_privilege(r.oid, c.oid, 'SELECT') ORDER BY c.relname"
)
_OVERLOADS = text(  # a schema's operators, and its functions named as built-in ones
    "SELECT (SELECT count(*) FROM pg_operator o WHERE o.oprnamespace = n.oid) AS operators, "
    "(SELECT count(*) FROM pg_proc p WHERE p.pronamespace = n.oid AND p.proname IN "
    "(SELECT proname FROM pg_proc WHERE pronamespace = 'pg_catalog'::regnamespace)) "
    "AS functions FROM pg_namespace n WHERE n.nspname = :schema"
)


def _own_lookup(conn: Connection, tables: dict[str, Any]) -> list[tuple[str | None, str]]:
    """What this connection itself reads under each table's name."""
    return [
        (
            row.relname,
            f"this connection reads {row.nspname}.{row.relname}, not the ledger's "
            f"{row.relname} (in "
            f"{tables['schema']}): {row.nspname} comes first on its search_path",
        )
        for row in conn.execute(
            text(
                "SELECT t.relname, n.nspname FROM unnest(CAST(:tables AS text[])) AS t(relname) "
                "JOIN pg_class c ON c.oid = to_regclass(quote_ident(t.relname)) "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname <> :schema ORDER BY t.relname"
            ),
            tables,
        )
    ]


def _name_lookup(conn: Connection, tables: dict[str, Any]) -> list[tuple[str | None, str]]:
    """What each login role that may read a ledger table finds under the table's name, and
    whether an operator or function it calls can be another schema's: one of a schema on its
    path, with argument types that match better (``=`` on ``varchar``) or ahead of
    ``pg_catalog``, answers in the built-in's place."""
    ledger = tables["schema"]
    try:
        role_paths = list(search_path.paths(conn))
    except search_path.UnknownDefault as exc:
        return [(None, str(exc))]
    elsewhere: dict[str, set[str]] = {}
    for row in conn.execute(_SHADOWS, tables):
        elsewhere.setdefault(row.nspname, set()).add(row.relname)
    readable: dict[str, list[str]] = {}
    superusers: set[str] = set()
    for row in conn.execute(_READERS, tables):
        readable.setdefault(row.rolname, []).append(row.relname)
        if row.rolsuper:
            superusers.add(row.rolname)
    usable = _Usable(conn)
    overloads: dict[str, tuple[int, int]] = {}
    found: list[tuple[str | None, str]] = []
    for path in role_paths:
        role = path.acting
        if role not in readable:
            continue
        who = path.role if role == path.role else f"{path.role} (acting as {role})"
        if ledger in path.schemas:
            ahead = path.schemas[: path.schemas.index(ledger)]
        elif role in superusers:
            continue  # a superuser reads every schema: one off this path is not its ledger
        else:  # the ledger's role with a path without its schema: a shadow anywhere answers
            ahead = path.schemas
        for table in readable[role]:
            first = next(
                (s for s in ahead if table in elsewhere.get(s, ()) and usable.uses(role, s)),
                None,
            )
            if first is not None:
                found.append(
                    (
                        table,
                        f"role {who} reads {first}.{table}, not the ledger's {table}: "
                        f"{first} comes first on its search_path",
                    )
                )
        for schema in path.schemas:
            if schema == "pg_catalog" or not usable.uses(role, schema):
                continue
            if schema not in overloads:
                counts = conn.execute(_OVERLOADS, {"schema": schema}).one()
                overloads[schema] = (counts.operators, counts.functions)
            operators, functions = overloads[schema]
            if operators or functions:
                found.append(
                    (
                        None,
                        f"role {who} searches {schema}, which holds {operators} operators and "
                        f"{functions} functions named as built-in ones: the ledger's queries "
                        "may call them in the built-ins' place (install extensions in a "
                        "schema the ledger's roles do not search)",
                    )
                )
    return found


class _Usable:
    """Whether a role may use a schema (Postgres skips, on a search path, the schemas a role
    may not use), asked once per pair."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.answers: dict[tuple[str, str], bool] = {}

    def uses(self, role: str, schema: str) -> bool:
        if (role, schema) not in self.answers:
            self.answers[role, schema] = bool(
                self.conn.execute(
                    text(
                        "SELECT coalesce(bool_or(has_schema_privilege(:role, oid, 'USAGE')), "
                        "false) FROM pg_namespace WHERE nspname = :schema"
                    ),
                    {"role": role, "schema": schema},
                ).scalar_one()
            )
        return self.answers[role, schema]


def _trigger(row: Any, function: str, kind: int) -> list[str]:
    """What is wrong with one guard trigger (its row of the catalog, None when absent)."""
    if row is None:
        return ["is missing: the table can be edited"]
    problems = []
    if row.tgenabled != "A":
        problems.append(f"is not enabled ALWAYS (state {row.tgenabled!r})")
    if row.tgtype != kind or row.conditional:
        problems.append("fires on other events or only under a condition")
    if _source_digest(row.prosrc) != FUNCTION_SOURCES[function]:
        problems.append(f"calls a function that is not the ledger's {function}()")
    return problems


def _source_digest(source: str | None) -> str | None:
    return hashlib.sha256(source.strip(" \n").encode()).hexdigest() if source else None


def sqlite_guard(table: str, verb: str) -> str:
    """The SQLite trigger refusing ``verb`` (UPDATE or DELETE) on ``table``, as migrations
    create it and the audit expects it."""
    return (
        f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
        f"BEGIN SELECT RAISE(ABORT, 'ledger table {table} is append-only: {verb} refused'); END"
    )


def sqlite_erasure_guard(table: str) -> str:
    """The SQLite trigger letting only a logged erasure delete from ``table``."""
    return (
        f"CREATE TRIGGER {table}_erasure_only BEFORE DELETE ON {table} "
        "WHEN NOT EXISTS (SELECT 1 FROM erasures WHERE request_id = OLD.request_id) "
        f"BEGIN SELECT RAISE(ABORT, 'ledger table {table} refused DELETE: only a logged "
        "erasure deletes content'); END"
    )


# Columns of the log the routes read as the ledger wrote them: bytes (BLOB), and the kind
# its hold and release leaves are found by (TEXT). SQLite keeps any type in any column: the
# same bytes written back as text read as equal to the audit, which reads every column as
# bytes, but some routes read them as no envelope, and a kind stored as a BLOB hides a hold
# from the kind's index. table: (what names a row, ((column, type), ...))
_TYPED_COLUMNS = {
    "log_entries": ("idx", (("envelope", "blob"), ("leaf_hash", "blob"), ("kind", "text"))),
    "signing_keys": ("log_index", (("public_key", "blob"),)),
    "checkpoints": ("tree_size", (("root_hash", "blob"),)),
    "merkle_nodes": ("level || ':' || idx", (("hash", "blob"),)),
}


def _sqlite_storage(conn: Connection) -> list[tuple[str | None, str]]:
    """Columns stored as another type than the ledger writes (one pass over each table), and
    what ``PRAGMA integrity_check`` finds (an index whose entries are not its table's: a
    partial index re-created without some rows and its SQL written back through
    ``writable_schema`` hides them from every query that uses it, and from no full scan)."""
    found: list[tuple[str | None, str]] = []
    for table, (row, columns) in _TYPED_COLUMNS.items():
        types = ", ".join(f"typeof({c})" for c, _ in columns)
        wrong = " OR ".join(f"typeof({c}) != '{t}'" for c, t in columns)
        for name, *kinds in conn.execute(
            text(f"SELECT {row}, {types} FROM {table} WHERE {wrong} LIMIT 5")
        ):
            for (column, want), kind in zip(columns, kinds, strict=True):
                if kind != want:
                    found.append(
                        (table, f"{column} of row {name} is stored as {kind}, not as {want}")
                    )
    problems = [str(r[0]) for r in conn.execute(text("PRAGMA integrity_check(20)"))]
    if problems != ["ok"]:
        found.append((None, "PRAGMA integrity_check: " + "; ".join(problems)))
    return found


def _sqlite(conn: Connection) -> list[tuple[str | None, str]]:
    stored = {
        row.name: (row.tbl_name, row.sql)
        for row in conn.execute(
            text("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger'")
        )
    }
    found: list[tuple[str | None, str]] = []
    for table in TABLES:
        erasable = table in ERASABLE_TABLES
        delete = sqlite_erasure_guard(table) if erasable else sqlite_guard(table, "DELETE")
        for sql in (sqlite_guard(table, "UPDATE"), delete):
            name = sql.split()[2]
            got = stored.get(name)
            if got is None:
                found.append((table, f"trigger {name} is missing: the table can be edited"))
            elif got != (table, sql):
                found.append((table, f"trigger {name} is not the ledger's: it was replaced"))
    return found + _sqlite_storage(conn)
