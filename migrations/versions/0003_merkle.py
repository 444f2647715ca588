"""Merkle tree nodes and signed checkpoints (append-only, like the other ledger tables).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TABLES = ("merkle_nodes", "checkpoints")


def upgrade() -> None:
    op.create_table(
        "merkle_nodes",
        sa.Column("level", sa.SmallInteger(), primary_key=True, autoincrement=False),
        sa.Column("idx", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("hash", sa.LargeBinary(32), nullable=False),
    )
    op.create_table(
        "checkpoints",
        sa.Column("tree_size", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("root_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("signed_at", sa.DateTime(timezone=True), nullable=False),
    )
    dialect = op.get_bind().dialect.name
    for t in TABLES:
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
                op.execute(
                    f"CREATE TRIGGER {t}_no_{verb.lower()} BEFORE {verb} ON {t} "
                    f"BEGIN SELECT RAISE(ABORT, 'ledger table {t} is append-only: "
                    f"{verb} refused'); END"
                )


def downgrade() -> None:
    for t in TABLES:
        op.drop_table(t)
