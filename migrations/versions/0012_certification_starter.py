"""Who started each certification job: the token that may cancel it.

A job started before this revision names no token; an ``admin`` token cancels it, as it
cancels any job.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("certification_jobs", sa.Column("started_by", sa.String(100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("certification_jobs") as batch:
        batch.drop_column("started_by")
