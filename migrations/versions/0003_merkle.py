"""Merkle tree nodes and signed checkpoints (append-only, like the other ledger tables).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations import append_only

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
    append_only.install(TABLES)


def downgrade() -> None:
    for t in TABLES:
        op.drop_table(t)
