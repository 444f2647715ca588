"""A superuser who changes what the server's role reads without touching the ledger's tables:
a view in a schema its search path reaches first, a child table, a column default. Each is
shown to change what that role reads (or writes), then `ledger audit`, connecting as another
role, names it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

import migrations
from ledger.storage import checkpoints, ingest
from ledger.storage.audit import audit
from ledger.storage.database import Database
from ledger.storage.search_path import command_line_setting, searched, split
from tests.support.documents import record_envelope
from tests.support.scratch_postgres import scratch_postgres
from tests.support.seed import seed_ledger

ORIGIN = "test.example/log"
NOT_DUE = {"checkpoint_interval": 3600}
RECORDS = 4


class Cluster:
    """A migrated, seeded ledger database, a login role of this test's own that reads it as
    the server's role does, and the superuser's connection to it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.db = Database(url)
        seeded = seed_ledger(self.db)
        self.log_key = seeded.log_key
        envs = [
            record_envelope(seeded.collector, seeded.fingerprint_id).to_dict()
            for _ in range(RECORDS)
        ]
        self.request_ids = [r.request_id for r in ingest.ingest_records(self.db, envs)]
        checkpoints.sign_if_new(self.db, self.log_key, ORIGIN)
        self.role = f"ledger_app_{uuid.uuid4().hex[:8]}"
        self.superuser(
            sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(self.role)),
            sql.SQL("GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA public TO {}").format(
                sql.Identifier(self.role)
            ),
        )

    def superuser(self, *statements: str | sql.Composable) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            for stmt in statements:
                conn.execute(stmt)

    def as_role(self, query: str) -> int:
        """What the role's own connection reads (a fresh login: its settings apply)."""
        parts = urlsplit(self.url.replace("postgresql+psycopg://", "postgresql://"))
        url = urlunsplit(
            parts._replace(netloc=f"{self.role}@{parts.hostname}:{parts.port or 5432}")
        )
        with psycopg.connect(url) as conn:
            return conn.execute(query).fetchone()[0]  # type: ignore[index]

    def findings(self, as_role: bool = False) -> list[tuple[str | None, str]]:
        """The database findings of an audit that logs in afresh, as `ledger audit` does: as
        the superuser, or as the test's role."""
        url = self.url
        if as_role:
            parts = urlsplit(url)
            host = f"{self.role}@{parts.hostname}:{parts.port or 5432}"
            url = urlunsplit(parts._replace(netloc=host))
        db = Database(url)
        try:
            report = audit(db, self.log_key.public_key, **NOT_DUE)
        finally:
            db.dispose()
        return [(f.table, f.message) for f in report.findings if f.check == "database"]

    def drop(self) -> None:
        self.db.dispose()
        role = sql.Identifier(self.role)
        self.superuser(
            sql.SQL("DROP OWNED BY {}").format(role), sql.SQL("DROP ROLE {}").format(role)
        )


@pytest.fixture
def cluster(postgres_databases) -> Iterator[Cluster]:
    made = Cluster(postgres_databases.fresh())
    assert made.findings() == []
    assert made.as_role("SELECT count(*) FROM records") == RECORDS
    try:
        yield made
    finally:
        made.drop()


def _shadow(cluster: Cluster, schema: str) -> None:
    """A view of every record but the first, in ``schema``, that the role may read."""
    cluster.superuser(
        sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)),
        sql.SQL(
            "CREATE VIEW {}.records AS SELECT * FROM public.records WHERE request_id <> {}"
        ).format(sql.Identifier(schema), sql.Literal(cluster.request_ids[0])),
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(schema), sql.Identifier(cluster.role)
        ),
        sql.SQL("GRANT SELECT ON {}.records TO {}").format(
            sql.Identifier(schema), sql.Identifier(cluster.role)
        ),
    )


@pytest.mark.postgres
def test_a_view_in_the_schema_named_for_the_role_is_named(cluster: Cluster):
    """The default search path is ``"$user", public``: a schema named after the server's
    role, holding a view called records, answers for the table with no setting changed."""
    _shadow(cluster, cluster.role)
    assert cluster.as_role("SELECT count(*) FROM records") == RECORDS - 1  # the attack works
    found = cluster.findings()
    assert (
        "records",
        f"role {cluster.role} reads {cluster.role}.records, not the ledger's records: "
        f"{cluster.role} comes first on its search_path",
    ) in found
    assert len(found) == 1, found  # the auditor's own connection is not fooled


@pytest.mark.postgres
@pytest.mark.parametrize("scope", ["role", "role in database", "database"])
def test_a_search_path_set_for_the_role_is_followed(cluster: Cluster, scope: str):
    _shadow(cluster, "Evil")
    target = {
        "role": sql.SQL("ROLE {}").format(sql.Identifier(cluster.role)),
        "role in database": sql.SQL("ROLE {} IN DATABASE {}").format(
            sql.Identifier(cluster.role), sql.Identifier(urlsplit(cluster.url).path[1:])
        ),
        "database": sql.SQL("DATABASE {}").format(sql.Identifier(urlsplit(cluster.url).path[1:])),
    }[scope]
    cluster.superuser(sql.SQL('ALTER {} SET search_path = "Evil", public').format(target))
    assert cluster.as_role("SELECT count(*) FROM records") == RECORDS - 1
    found = cluster.findings()
    assert any(
        table == "records" and f"role {cluster.role} reads Evil.records" in message
        for table, message in found
    )
    # The auditor logs in under the database's setting too: it names what it reads itself.
    assert (scope == "database") == any(
        message.startswith("this connection reads Evil.records") for _, message in found
    )


@pytest.mark.postgres
def test_a_search_path_without_the_ledger_schema_is_followed(cluster: Cluster):
    _shadow(cluster, "elsewhere")
    cluster.superuser(
        sql.SQL("ALTER ROLE {} SET search_path = elsewhere").format(sql.Identifier(cluster.role))
    )
    assert cluster.as_role("SELECT count(*) FROM records") == RECORDS - 1
    assert any("reads elsewhere.records" in m for _, m in cluster.findings())


@pytest.mark.postgres
def test_a_shadow_the_role_may_not_use_is_not_a_finding(cluster: Cluster):
    """Postgres skips a schema the role has no USAGE on, so such a view answers nothing."""
    _shadow(cluster, cluster.role)
    cluster.superuser(
        sql.SQL("REVOKE USAGE ON SCHEMA {} FROM {}").format(
            sql.Identifier(cluster.role), sql.Identifier(cluster.role)
        )
    )
    assert cluster.as_role("SELECT count(*) FROM records") == RECORDS
    assert cluster.findings() == []


@pytest.mark.postgres
def test_alter_role_all_yields_to_the_database_setting(cluster: Cluster):
    """Postgres applies a database's setting over ALTER ROLE ALL's, whichever is read last."""
    _shadow(cluster, "shadow")
    database = sql.Identifier(urlsplit(cluster.url).path[1:])
    cluster.superuser(
        "ALTER ROLE ALL SET search_path = public",
        sql.SQL("ALTER DATABASE {} SET search_path = shadow, public").format(database),
    )
    try:
        assert cluster.as_role("SELECT count(*) FROM records") == RECORDS - 1
        assert any(f"role {cluster.role} reads shadow.records" in m for _, m in cluster.findings())
    finally:
        cluster.superuser("ALTER ROLE ALL RESET search_path")


@pytest.mark.postgres
def test_a_role_setting_is_followed_to_the_role_it_acts_as(cluster: Cluster):
    """ALTER ROLE ... SET role: sessions act as a group role, its name is ``$user`` and its
    privileges apply; the login role itself may read nothing."""
    group = f"{cluster.role}_grp"
    g, login = sql.Identifier(group), sql.Identifier(cluster.role)
    cluster.superuser(
        sql.SQL("CREATE ROLE {} NOLOGIN").format(g),
        sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(g),
        sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {}").format(login),
        sql.SQL("GRANT {} TO {}").format(g, login),
        sql.SQL("ALTER ROLE {} SET role = {}").format(login, sql.Literal(group)),
    )
    try:
        _shadow(cluster, group)
        cluster.superuser(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(g, g),
            sql.SQL("GRANT SELECT ON {}.records TO {}").format(g, g),
        )
        assert cluster.as_role("SELECT count(*) FROM records") == RECORDS - 1
        assert any(
            f"role {cluster.role} (acting as {group}) reads {group}.records" in m
            for _, m in cluster.findings()
        )
    finally:
        cluster.superuser(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(g),
            sql.SQL("DROP OWNED BY {}").format(g),
            sql.SQL("DROP ROLE {}").format(g),
        )


@pytest.mark.postgres
def test_an_operator_behind_pg_catalog_that_matches_better_is_named(cluster: Cluster):
    """CVE-2018-1058's pattern: with the default path, public's = on varchar beats
    pg_catalog's = on text, and a lookup by request ID finds what it should not."""
    cluster.superuser(
        "CREATE FUNCTION public.loose_eq(varchar, varchar) RETURNS boolean LANGUAGE sql "
        "AS $$ SELECT $1::text = $2::text OR $2::text = 'forged' $$",
        "CREATE OPERATOR public.= (LEFTARG = varchar, RIGHTARG = varchar, "
        "FUNCTION = public.loose_eq)",
    )
    forged = cluster.as_role("SELECT count(*) FROM records WHERE request_id = 'forged'::varchar")
    assert forged == RECORDS
    assert any(
        f"role {cluster.role} searches public, which holds 1 operators" in m
        for _, m in cluster.findings()
    )


@pytest.mark.postgres
def test_a_superuser_off_a_ledger_in_another_schema_is_not_a_finding(cluster: Cluster):
    """A ledger in its own schema beside another relation called records in public: a
    superuser, whose path does not reach the ledger, reads no ledger at all."""
    cluster.superuser(
        "ALTER SCHEMA public RENAME TO ledger_b",
        "CREATE SCHEMA public",
        "CREATE TABLE public.records (x int)",
        sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(cluster.role)),
    )
    url = cluster.url + ("&" if "?" in cluster.url else "?") + "options=-csearch_path%3Dledger_b"
    db = Database(url)
    try:
        report = audit(db, cluster.log_key.public_key, **NOT_DUE)
    finally:
        db.dispose()
    found = [f.message for f in report.findings if f.check == "database"]
    with psycopg.connect(cluster.url) as conn:
        superusers = [r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolsuper")]
    assert superusers
    assert not [m for m in found if any(m.startswith(f"role {u} ") for u in superusers)], found
    # the test's own role, given the ledger's tables, does not reach them: it reads public's
    assert any(m.startswith(f"role {cluster.role} reads public.records") for m in found), found


@pytest.mark.postgres
def test_an_auditor_with_its_own_path_that_cannot_read_the_server_default_says_so(
    cluster: Cluster,
):
    """The server's default path is the reset value only of a session without a setting of
    its own; an auditor given one (a superuser steering it) cannot tell what roles without
    settings search, and says so rather than assume Postgres's built-in default."""
    login = sql.Identifier(cluster.role)
    cluster.superuser(sql.SQL("ALTER ROLE {} SET search_path = public").format(login))
    found = cluster.findings(as_role=True)
    assert any("pg_read_file(text)" in message for _, message in found), found


@pytest.mark.postgres
def test_a_search_path_on_the_servers_command_line_is_followed(postgres_databases):
    """A server started as ``postgres -c search_path=tricks,public`` gives that path to every
    role without a setting of its own. An auditor with one (its session's reset value is its
    own) reads the server's from its command line, ``postmaster.opts``, which overrides the
    configuration files, and names the view the ledger's role then reads; without that file
    it says it cannot tell."""
    del postgres_databases  # the shared server must be up (skips, or fails under CI, if not)
    with scratch_postgres("-c", "search_path=tricks,public") as server:
        admin = server.url
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE ledger")
            conn.execute("ALTER ROLE postgres SET search_path = public")  # the auditor's own
        url = admin.rpartition("/")[0] + "/ledger"
        migrated = Database(url)
        migrations.upgrade(migrated)
        migrated.dispose()
        made = Cluster(url)
        try:
            _shadow(made, "tricks")
            assert made.as_role("SELECT count(*) FROM records") == RECORDS - 1  # it works
            assert (
                "records",
                f"role {made.role} reads tricks.records, not the ledger's records: "
                "tricks comes first on its search_path",
            ) in made.findings()
            # Without postmaster.opts the command line cannot be told: said, not assumed
            (server.data / "postmaster.opts").unlink()
            assert any(
                "postmaster.opts" in message and "cannot be read" in message
                for _, message in made.findings()
            )
        finally:
            made.db.dispose()


# postmaster.opts as the postmaster writes it: the program, then each argument in double
# quotes, unescaped (Postgres's CreateOptsFile).
@pytest.mark.parametrize(
    ("args", "value"),
    [
        (["-D", "/var/lib/pg", "-c", "config_file=/etc/pg.conf"], None),
        (["-D", "/d", "-c", "search_path=a, b"], "a, b"),
        (["-csearch_path=x", "--search-path=y"], "y"),
        (["--SEARCH_PATH=x", "-c", "port=5"], "x"),
        (["-c", 'search_path="Tricks", public'], '"Tricks", public'),
        (["-c", 'search_path="a b", c\\'], '"a b", c\\'),
        (["-Fcsearch_path=x"], "x"),  # flags bundled before -c
        (["-ec", "search_path=y"], "y"),  # -c's argument the next one
        (["-D", "-csearch_path=z", "-c", "search_path=w"], "w"),  # -D's argument, not -c
        (["-D", "-csearch_path=z"], None),
        (["-c", "search_path_other=x", "-c"], None),
        (["-c", "search_path=a", "--", "-c", "search_path=b"], "a"),
        ([], None),
    ],
)
def test_the_command_lines_setting_is_read_as_postgres_reads_it(args: list[str], value: str | None):
    opts = "/usr/lib/postgresql/15/bin/postgres" + "".join(f' "{a}"' for a in args) + "\n"
    assert command_line_setting(opts, "search_path") == value


def test_a_command_line_not_as_the_postmaster_writes_it_is_refused():
    with pytest.raises(ValueError):
        command_line_setting('/pg "-c" "search_path=unclosed\n', "search_path")


@pytest.mark.postgres
def test_an_auditor_that_cannot_read_the_servers_command_line_says_so(cluster: Cluster):
    """An auditor with a path of its own, allowed to read the configuration files but not
    the server's command line, cannot rule out a path given there: it says so; given that
    too, it reads the server's default and finds nothing."""
    login = sql.Identifier(cluster.role)
    cluster.superuser(
        sql.SQL("ALTER ROLE {} SET search_path = public").format(login),
        sql.SQL("GRANT SELECT ON pg_file_settings TO {}").format(login),
        sql.SQL("GRANT EXECUTE ON FUNCTION pg_show_all_file_settings() TO {}").format(login),
    )
    found = cluster.findings(as_role=True)
    assert any("pg_read_file(text)" in message for _, message in found), found
    cluster.superuser(sql.SQL("GRANT EXECUTE ON FUNCTION pg_read_file(text) TO {}").format(login))
    assert cluster.findings(as_role=True) == []


@pytest.mark.postgres
def test_an_identity_column_is_named(cluster: Cluster):
    cluster.superuser("ALTER TABLE records ALTER COLUMN tier ADD GENERATED BY DEFAULT AS IDENTITY")
    assert any(
        t == "records" and "column records.tier is an identity column" in m
        for t, m in cluster.findings()
    )


@pytest.mark.postgres
def test_built_in_functions_shadowed_ahead_of_pg_catalog_are_named(cluster: Cluster):
    cluster.superuser(
        "CREATE SCHEMA tricks",
        "CREATE FUNCTION tricks.length(bytea) RETURNS integer LANGUAGE sql AS 'SELECT 0'",
        sql.SQL("GRANT USAGE ON SCHEMA tricks TO {}").format(sql.Identifier(cluster.role)),
        sql.SQL("ALTER ROLE {} SET search_path = tricks, pg_catalog, public").format(
            sql.Identifier(cluster.role)
        ),
    )
    assert cluster.as_role("SELECT max(length(envelope)) FROM log_entries") == 0
    assert any(
        t is None
        and m.startswith(
            f"role {cluster.role} searches tricks, which holds 0 operators and 1 functions "
            "named as built-in ones"
        )
        for t, m in cluster.findings()
    )


@pytest.mark.postgres
def test_a_child_table_adds_rows_to_the_ledger_table_and_is_named(cluster: Cluster):
    cluster.superuser(
        "CREATE TABLE ghost_records () INHERITS (records)",
        "INSERT INTO ghost_records SELECT * FROM records LIMIT 1",
    )
    assert cluster.as_role("SELECT count(*) FROM records") == RECORDS + 1
    assert any(
        t == "records" and "ghost_records inherits from records" in m for t, m in cluster.findings()
    )


@pytest.mark.postgres
def test_a_column_default_is_named(cluster: Cluster):
    cluster.superuser("ALTER TABLE checkpoints ALTER COLUMN note SET DEFAULT 'forged'")
    assert any(
        t == "checkpoints" and "column checkpoints.note has a default ('forged'::text)" in m
        for t, m in cluster.findings()
    )


@pytest.mark.parametrize(
    ("value", "schemas"),
    [
        ('"$user", public', ("pg_catalog", "app", "public")),
        ("public", ("pg_catalog", "public")),
        ('Evil, "Evil", "a""b" ,, pg_catalog', ("evil", "Evil", 'a"b', "pg_catalog")),
        ("pg_temp, x", ("pg_catalog", "x")),
        ("", ("pg_catalog",)),
        ("x, x", ("pg_catalog", "x")),
        ("Ünï, ÄB", ("pg_catalog", "Ünï", "Äb")),  # Postgres folds ASCII letters only
        ("x" * 70, ("pg_catalog", "x" * 63)),  # and keeps 63 bytes of a name
        ("é" * 40, ("pg_catalog", "é" * 31)),  # whole characters
    ],
)
def test_a_search_path_is_read_as_postgres_reads_it(value: str, schemas: tuple[str, ...]):
    assert searched(value, "app") == schemas


def test_split_keeps_quoted_commas():
    assert split('"a,b", c') == ["a,b", "c"]


@pytest.mark.postgres
def test_an_operator_added_to_pg_catalog_is_named(cluster: Cluster):
    """pg_catalog is searched first on every path, so the check of schemas on a path (which
    trusts pg_catalog) does not see an = on varchar a superuser put there."""
    cluster.superuser(
        "CREATE FUNCTION pg_catalog.loose_eq(varchar, varchar) RETURNS boolean LANGUAGE sql "
        "AS $$ SELECT $1::text = $2::text OR $2::text = 'forged' $$",
        "CREATE OPERATOR pg_catalog.= (LEFTARG = varchar, RIGHTARG = varchar, "
        "FUNCTION = pg_catalog.loose_eq)",
    )
    forged = cluster.as_role("SELECT count(*) FROM records WHERE request_id = 'forged'::varchar")
    assert forged == RECORDS  # the attack works
    messages = [m for _, m in cluster.findings()]
    assert any(
        "pg_catalog holds the operator =(character varying,character varying)" in m
        for m in messages
    ), messages
    assert any(
        "pg_catalog holds the function loose_eq(character varying,character varying)" in m
        for m in messages
    ), messages


@pytest.mark.postgres
def test_a_cast_added_between_built_in_types_is_named(cluster: Cluster):
    """Casts have no schema: one added between built-in types, its function anywhere, can
    change which operator a query resolves to, whatever the reading role's path."""
    cluster.superuser(
        "CREATE SCHEMA hidden",
        "CREATE FUNCTION hidden.as_int(varchar) RETURNS integer LANGUAGE sql AS $$ SELECT 1 $$",
        "CREATE CAST (varchar AS integer) WITH FUNCTION hidden.as_int(varchar) AS IMPLICIT",
    )
    found = cluster.findings()
    assert (
        None,
        "a cast (character varying AS integer) was added between built-in types: the "
        "ledger's queries may resolve their operators and functions through it",
    ) in found
