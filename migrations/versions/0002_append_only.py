"""Append-only ledger tables: triggers refuse UPDATE, DELETE and TRUNCATE.

On Postgres the triggers are enabled ALWAYS, so ``session_replication_role = replica``
does not bypass them; only an explicit ``ALTER TABLE ... DISABLE TRIGGER`` by the table
owner or a superuser does, and ``ledger audit`` exists for exactly that case. SQLite gets
equivalent UPDATE/DELETE triggers (it has no TRUNCATE).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

from migrations import append_only

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TABLES = ("log_entries", "signing_keys", "key_revocations", "fingerprints", "records")

PG_FUNCTION = """
CREATE OR REPLACE FUNCTION ledger_refuse_mutation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger table %% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTION.replace("%%", "%"))
    append_only.install(TABLES)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        for t in TABLES:
            op.execute(f"DROP TRIGGER IF EXISTS {t}_append_only ON {t}")
            op.execute(f"DROP TRIGGER IF EXISTS {t}_no_truncate ON {t}")
        op.execute("DROP FUNCTION IF EXISTS ledger_refuse_mutation()")
    elif dialect == "sqlite":
        for t in TABLES:
            op.execute(f"DROP TRIGGER IF EXISTS {t}_no_update")
            op.execute(f"DROP TRIGGER IF EXISTS {t}_no_delete")
