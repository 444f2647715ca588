"""Workers bound to keys: keep each worker's last signed heartbeat; no claimed invariance.

A worker row now holds the canonical ``worker_heartbeat`` envelope it was last refreshed by
(re-verified on every read) and that heartbeat's ``issued_at`` (a new one must be later). The
``batch_invariance`` column goes: the ledger derives it from the worker's fingerprint. Rows
registered before heartbeats were signed are dropped (unauthenticated; a running collector
registers again with its next heartbeat, within seconds).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.execute("DELETE FROM workers")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("batch_invariance")
        batch.add_column(sa.Column("heartbeat", sa.LargeBinary(), nullable=False))
        batch.add_column(sa.Column("heartbeat_issued_at", TZ, nullable=False))


def downgrade() -> None:
    op.execute("DELETE FROM workers")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("heartbeat_issued_at")
        batch.drop_column("heartbeat")
        batch.add_column(sa.Column("batch_invariance", sa.String(20), nullable=False))
