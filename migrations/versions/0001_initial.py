"""Initial schema: log entries, signing keys, revocations, fingerprints, records, tokens.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "log_entries",
        sa.Column("idx", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("leaf_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("envelope", sa.LargeBinary(), nullable=False),
        sa.Column("appended_at", TZ, nullable=False),
    )
    op.create_table(
        "signing_keys",
        sa.Column("key_id", sa.String(80), primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("public_key", sa.LargeBinary(32), nullable=False),
        sa.Column("log_index", sa.BigInteger(), sa.ForeignKey("log_entries.idx"), nullable=False),
        sa.Column("registered_at", TZ, nullable=False),
        sa.UniqueConstraint("log_index", name="uq_signing_keys_log_index"),
    )
    op.create_table(
        "key_revocations",
        sa.Column("key_id", sa.String(80), sa.ForeignKey("signing_keys.key_id"), primary_key=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("log_index", sa.BigInteger(), sa.ForeignKey("log_entries.idx"), nullable=False),
        sa.Column("revoked_at", TZ, nullable=False),
        sa.UniqueConstraint("log_index", name="uq_key_revocations_log_index"),
    )
    op.create_table(
        "fingerprints",
        sa.Column("fingerprint_id", sa.String(80), primary_key=True),
        sa.Column("key_id", sa.String(80), sa.ForeignKey("signing_keys.key_id"), nullable=False),
        sa.Column("log_index", sa.BigInteger(), sa.ForeignKey("log_entries.idx"), nullable=False),
        sa.Column("registered_at", TZ, nullable=False),
        sa.UniqueConstraint("log_index", name="uq_fingerprints_log_index"),
    )
    op.create_table(
        "records",
        sa.Column("request_id", sa.String(200), primary_key=True),
        sa.Column("log_index", sa.BigInteger(), sa.ForeignKey("log_entries.idx"), nullable=False),
        sa.Column("content_hash", sa.String(71), nullable=False),
        sa.Column(
            "fingerprint_id",
            sa.String(80),
            sa.ForeignKey("fingerprints.fingerprint_id"),
            nullable=False,
        ),
        sa.Column("key_id", sa.String(80), sa.ForeignKey("signing_keys.key_id"), nullable=False),
        sa.Column("model", sa.String(300), nullable=False),
        sa.Column("tier", sa.SmallInteger(), nullable=False),
        sa.Column("pool", sa.String(100), nullable=False),
        sa.Column("worker_id", sa.String(100), nullable=False),
        sa.Column("endpoint", sa.String(40), nullable=False),
        sa.Column("received_at", TZ, nullable=False),
        sa.UniqueConstraint("log_index", name="uq_records_log_index"),
    )
    op.create_index("ix_records_model_idx", "records", ["model", "log_index"])
    op.create_index("ix_records_fingerprint_idx", "records", ["fingerprint_id", "log_index"])
    op.create_index("ix_records_received_at", "records", ["received_at"])
    op.create_table(
        "api_tokens",
        sa.Column("token_id", sa.String(20), primary_key=True),
        sa.Column("token_hash", sa.String(71), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("scopes", sa.String(200), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("revoked_at", TZ, nullable=True),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )


def downgrade() -> None:
    for table in (
        "api_tokens",
        "records",
        "fingerprints",
        "key_revocations",
        "signing_keys",
        "log_entries",
    ):
        op.drop_table(table)
