"""Workers (registration and heartbeat), replay verdicts, pool certificates, cache keys.

``workers`` is live state (a heartbeat updates it), not a ledger table. ``replays``,
``certificates`` and ``cache_keys`` index signed log leaves and are append-only like the rest.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations import append_only

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
APPEND_ONLY = ("replays", "certificates", "cache_keys")


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(100), primary_key=True),
        sa.Column("pool", sa.String(100), nullable=False),
        sa.Column("url", sa.String(500), nullable=False),
        sa.Column("fingerprint_id", sa.String(80), nullable=False),
        sa.Column("batch_invariance", sa.String(20), nullable=False),
        sa.Column("key_id", sa.String(80), nullable=False),
        sa.Column("registered_at", TZ, nullable=False),
        sa.Column("last_seen", TZ, nullable=False),
    )
    op.create_index("ix_workers_pool", "workers", ["pool"])
    op.create_table(
        "replays",
        sa.Column("replay_id", sa.String(40), primary_key=True),
        sa.Column(
            "request_id", sa.String(200), sa.ForeignKey("records.request_id"), nullable=False
        ),
        sa.Column("log_index", sa.BigInteger(), sa.ForeignKey("log_entries.idx"), nullable=False),
        sa.Column("verdict", sa.String(40), nullable=False),
        sa.Column("pool", sa.String(100), nullable=False),
        sa.Column("worker_id", sa.String(100), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.UniqueConstraint("log_index", name="uq_replays_log_index"),
    )
    op.create_index("ix_replays_request", "replays", ["request_id", "log_index"])
    op.create_table(
        "certificates",
        sa.Column("certificate_id", sa.String(40), primary_key=True),
        sa.Column("pool", sa.String(100), nullable=False),
        sa.Column("fingerprint_id", sa.String(80), nullable=False),
        sa.Column("log_index", sa.BigInteger(), sa.ForeignKey("log_entries.idx"), nullable=False),
        sa.Column("invariant", sa.Boolean(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.UniqueConstraint("log_index", name="uq_certificates_log_index"),
    )
    op.create_index("ix_certificates_fingerprint", "certificates", ["fingerprint_id"])
    op.create_table(
        "cache_keys",
        sa.Column("cache_key", sa.String(80), primary_key=True),
        sa.Column("request_id", sa.String(200), primary_key=True),
        sa.Column("log_index", sa.BigInteger(), nullable=False),
        sa.Column("tier", sa.SmallInteger(), nullable=False),
        sa.Column("deterministic", sa.Boolean(), nullable=False),
    )
    append_only.install(APPEND_ONLY)


def downgrade() -> None:
    for t in (*APPEND_ONLY, "workers"):
        op.drop_table(t)
