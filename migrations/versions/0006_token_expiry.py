"""API tokens may expire: a nullable ``expires_at`` on ``api_tokens``.

NULL (every token created before this revision, and those created without ``--expires``)
means the token never expires. ``api_tokens`` is not a ledger table (tokens are revoked in
place), so this adds no path to the append-only tables.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("expires_at")
