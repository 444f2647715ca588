"""Certification jobs in the database, so every API process answers a poll and a stopped
process's jobs end visibly (``ledger.storage.certification_jobs``).

``certification_jobs`` is live state (a running job's progress and lease are updated in
place), not a ledger table: it gets no append-only triggers. The certificate a job produces
stays a log leaf indexed by ``certificates``; a done job's row points at its leaf.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "certification_jobs",
        sa.Column("certification_id", sa.String(40), primary_key=True),
        sa.Column("pool", sa.String(100), nullable=False),
        sa.Column("worker_id", sa.String(100), nullable=False),
        sa.Column("fingerprint_id", sa.String(80), nullable=False),
        sa.Column("parameters", sa.Text(), nullable=False),
        sa.Column("state", sa.String(10), nullable=False),
        sa.Column("done", sa.BigInteger(), nullable=False),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("certificate_id", sa.String(40), nullable=True),
        sa.Column("log_index", sa.BigInteger(), sa.ForeignKey("log_entries.idx"), nullable=True),
        sa.Column("runner", sa.String(200), nullable=False),
        sa.Column("lease_until", TZ, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
        sa.CheckConstraint(
            "state IN ('running', 'done', 'failed')", name="ck_certification_jobs_state"
        ),
        sa.CheckConstraint(
            "(state = 'done') = (log_index IS NOT NULL)", name="ck_certification_jobs_done"
        ),
    )
    op.create_index(
        "ix_certification_jobs_state_lease", "certification_jobs", ["state", "lease_until"]
    )


def downgrade() -> None:
    op.drop_table("certification_jobs")
