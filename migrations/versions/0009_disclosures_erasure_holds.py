"""Record schema v2: disclosures kept apart from the log, erasure events and legal holds.

``disclosures`` holds the salted disclosures of v2 records (and of their replay outputs), one
row per digest; ``erasures``, ``holds`` and ``hold_releases`` index log leaves and are
append-only. ``disclosures`` and ``cache_keys`` are the only tables from which rows may be
deleted, and only for a request ID that ``erasures`` already holds: the erasure event is
written first, in the same transaction. UPDATE and TRUNCATE stay refused on both.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from ledger.storage.protections import sqlite_erasure_guard, sqlite_guard
from migrations import append_only

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
APPEND_ONLY = ("erasures", "holds", "hold_releases")
ERASABLE = ("disclosures", "cache_keys")

PG_FUNCTION = """
CREATE OR REPLACE FUNCTION ledger_delete_only_erased() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND EXISTS (SELECT 1 FROM erasures WHERE request_id = OLD.request_id)
    THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'ledger table % refused %: only a logged erasure deletes content',
        TG_TABLE_NAME, TG_OP USING ERRCODE = 'insufficient_privilege';
END;
$$;
"""


def _erasable_triggers(table: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        # Named as every ledger table's mutation guard (tests and runbooks re-enable it by name).
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION ledger_delete_only_erased()"
        )
        op.execute(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_append_only")
    else:
        op.execute(sqlite_guard(table, "UPDATE"))
        op.execute(sqlite_erasure_guard(table))


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        "erasures",
        sa.Column(
            "request_id", sa.String(200), sa.ForeignKey("records.request_id"), primary_key=True
        ),
        sa.Column("log_index", sa.BigInteger(), sa.ForeignKey("log_entries.idx"), nullable=False),
        sa.Column("reason_code", sa.String(20), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.UniqueConstraint("log_index", name="uq_erasures_log_index"),
    )
    op.create_table(
        "disclosures",
        sa.Column("request_id", sa.String(200), primary_key=True),
        sa.Column("digest", sa.String(71), primary_key=True),
        sa.Column("log_index", sa.BigInteger(), sa.ForeignKey("log_entries.idx"), nullable=False),
        sa.Column("disclosure", sa.Text(), nullable=False),
    )
    op.create_index("ix_disclosures_log_index", "disclosures", ["log_index"])
    op.create_table(
        "holds",
        sa.Column("hold_id", sa.String(40), primary_key=True),
        sa.Column("log_index", sa.BigInteger(), sa.ForeignKey("log_entries.idx"), nullable=False),
        sa.Column("request_id", sa.String(200), nullable=True),
        sa.Column("filter", sa.Text(), nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.UniqueConstraint("log_index", name="uq_holds_log_index"),
    )
    op.create_table(
        "hold_releases",
        sa.Column("hold_id", sa.String(40), sa.ForeignKey("holds.hold_id"), primary_key=True),
        sa.Column("log_index", sa.BigInteger(), sa.ForeignKey("log_entries.idx"), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.UniqueConstraint("log_index", name="uq_hold_releases_log_index"),
    )
    append_only.install(APPEND_ONLY)
    if dialect == "postgresql":
        # Salted base64url does not compress: skip the attempt (as 0005 does for envelopes).
        op.execute("ALTER TABLE disclosures ALTER COLUMN disclosure SET STORAGE EXTERNAL")
        op.execute(PG_FUNCTION)
        op.execute("DROP TRIGGER IF EXISTS cache_keys_append_only ON cache_keys")
        op.execute(
            "CREATE TRIGGER disclosures_no_truncate BEFORE TRUNCATE ON disclosures "
            "FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_mutation()"
        )
        op.execute("ALTER TABLE disclosures ENABLE ALWAYS TRIGGER disclosures_no_truncate")
    else:
        op.execute("DROP TRIGGER IF EXISTS cache_keys_no_update")
        op.execute("DROP TRIGGER IF EXISTS cache_keys_no_delete")
    for table in ERASABLE:
        _erasable_triggers(table)


def downgrade() -> None:
    # The log's v2 records, erasures and holds would lose what only these tables hold (their
    # content, and the rows audit checks them against): refused while any of them has a row.
    bind = op.get_bind()
    for table in ("disclosures", "erasures", "holds", "hold_releases"):
        if bind.execute(sa.text(f"SELECT 1 FROM {table} LIMIT 1")).first() is not None:
            raise RuntimeError(
                f"revision 0009 cannot be undone: {table} holds rows the log depends on"
            )
    dialect = bind.dialect.name
    for table in ERASABLE:
        if dialect == "postgresql":
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
        else:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_erasure_only")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_update")
    if dialect == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS cache_keys_no_truncate ON cache_keys")
    append_only.install(("cache_keys",))
    for t in ("hold_releases", "holds", "disclosures", "erasures"):
        op.drop_table(t)
    if dialect == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS ledger_delete_only_erased()")
