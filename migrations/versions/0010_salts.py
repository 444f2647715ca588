"""Every disclosure salt the ledger accepted, kept after erasure: a salt used again is refused.

``salts`` holds the SHA-256 of each 16-byte window of each accepted salt
(``ledger.disclosures.salt_keys``: one for a salt of 16 bytes) and the leaf that committed to
it; rows are never updated or deleted, an erasure included (a random salt's hash confirms no
guess of what it salted). Filled here from the disclosures still stored, reading only the
first characters of each (those that hold its salt): the salts of content erased before
this revision are not known, and where two stored disclosures already share a salt one of
their leaves is kept.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from ledger.disclosures import parse, salt_keys, salt_of
from migrations import append_only

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

CHUNK = 2000
HEAD = 128  # characters: a salt of up to 90 bytes


def upgrade() -> None:
    op.create_table(
        "salts",
        sa.Column("salt_key", sa.LargeBinary(32), primary_key=True),
        sa.Column("log_index", sa.BigInteger(), nullable=False),
    )
    append_only.install(["salts"])
    bind = op.get_bind()
    insert = sa.text(
        "INSERT INTO salts (salt_key, log_index) VALUES (:k, :i) ON CONFLICT DO NOTHING"
    )
    # Only each disclosure's first characters are read (they hold its salt): a disclosure may
    # hold megabytes of content.
    page = sa.text(
        "SELECT request_id, digest, log_index, substr(disclosure, 1, :head) FROM disclosures "
        "WHERE (request_id, digest) > (:r, :d) ORDER BY request_id, digest LIMIT :n"
    )
    whole = sa.text("SELECT disclosure FROM disclosures WHERE request_id = :r AND digest = :d")
    after = ("", "")  # (request_id, digest): the disclosures' key, in order
    while True:
        rows = bind.execute(page, {"r": after[0], "d": after[1], "n": CHUNK, "head": HEAD}).all()
        if not rows:
            break
        found = []
        for rid, digest, log_index, head in rows:
            salt = salt_of(head)
            if salt is None:  # a salt longer than the head holds
                salt = parse(bind.execute(whole, {"r": rid, "d": digest}).scalar_one()).salt
            found += [{"k": key, "i": log_index} for key in salt_keys(salt)]
        bind.execute(insert, found)
        after = (rows[-1][0], rows[-1][1])


def downgrade() -> None:
    # Dropping the table forgets the salts of content erased since: refused once it has rows.
    bind = op.get_bind()
    if bind.execute(sa.text("SELECT 1 FROM salts LIMIT 1")).first() is not None:
        raise RuntimeError(
            "revision 0010 cannot be undone: salts holds what erased disclosures leave behind"
        )
    op.drop_table("salts")
