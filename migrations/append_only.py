"""The append-only triggers every ledger table gets, for use inside migration revisions.

Postgres: row triggers refusing UPDATE and DELETE and a statement trigger refusing TRUNCATE,
calling ``ledger_refuse_mutation()`` (created by revision 0002) and enabled ALWAYS, so
``session_replication_role = replica`` does not bypass them. SQLite: UPDATE and DELETE
triggers that abort (it has no TRUNCATE).
"""

from __future__ import annotations

from collections.abc import Iterable

from alembic import op

from ledger.storage.protections import sqlite_guard


def install(tables: Iterable[str]) -> None:
    dialect = op.get_bind().dialect.name
    for t in tables:
        if dialect == "postgresql":
            op.execute(
                f"CREATE TRIGGER {t}_append_only BEFORE UPDATE OR DELETE ON {t} "
                "FOR EACH ROW EXECUTE FUNCTION ledger_refuse_mutation()"
            )
            op.execute(
                f"CREATE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {t} "
                "FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_mutation()"
            )
            op.execute(f"ALTER TABLE {t} ENABLE ALWAYS TRIGGER {t}_append_only")
            op.execute(f"ALTER TABLE {t} ENABLE ALWAYS TRIGGER {t}_no_truncate")
        elif dialect == "sqlite":
            for verb in ("UPDATE", "DELETE"):
                op.execute(sqlite_guard(t, verb))
