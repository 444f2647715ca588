"""An index of the log's legal hold and hold release leaves.

Holds are read from their leaves (``ledger.storage.erasures``): a ``holds`` or
``hold_releases`` row deleted or edited is then an ``index_mismatch``, never a hold that
stops holding. The leaves are few, so a partial index on their kind finds them without
reading the log.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_HOLD_LEAVES = sa.text("kind IN ('legal_hold', 'hold_release')")


def upgrade() -> None:
    op.create_index(
        "ix_log_entries_hold_leaves",
        "log_entries",
        ["idx"],
        postgresql_where=_HOLD_LEAVES,
        sqlite_where=_HOLD_LEAVES,
    )


def downgrade() -> None:
    op.drop_index("ix_log_entries_hold_leaves", table_name="log_entries")
