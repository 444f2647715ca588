"""ORM models. Ledger tables are append-only (enforced by triggers; see migrations)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Tables whose rows are never updated or deleted once written.
APPEND_ONLY_TABLES = (
    "log_entries",
    "signing_keys",
    "key_revocations",
    "fingerprints",
    "records",
    "merkle_nodes",
    "checkpoints",
    "replays",
    "certificates",
    "erasures",
    "holds",
    "hold_releases",
    "salts",
)
# Tables whose rows are never updated, and deleted only for a request ID ``erasures`` holds
# (an erasure event logged in the same transaction; triggers enforce it).
ERASABLE_TABLES = ("disclosures", "cache_keys")


# The legal hold and release leaves: the predicate of their partial index, written as literal
# SQL in every query that means to use it (a bound parameter hides it from a generic plan).
HOLD_LEAVES = "kind IN ('legal_hold', 'hold_release')"


class Base(DeclarativeBase):
    pass


class LogEntry(Base):
    """One leaf of the log: an accepted signed envelope, in commit order."""

    __tablename__ = "log_entries"

    idx: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(40))
    leaf_hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    # RFC 8785 canonical bytes of the whole envelope: exactly what the leaf hash covers.
    envelope: Mapped[bytes] = mapped_column(LargeBinary)
    appended_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    # the legal hold and release leaves, which holds are read from (revision 0011)
    __table_args__ = (
        Index(
            "ix_log_entries_hold_leaves",
            "idx",
            postgresql_where=text(HOLD_LEAVES),
            sqlite_where=text(HOLD_LEAVES),
        ),
    )


class MerkleNode(Base):
    """Hash of the complete subtree of 2**level leaves starting at leaf idx * 2**level."""

    __tablename__ = "merkle_nodes"

    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    idx: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    hash: Mapped[bytes] = mapped_column(LargeBinary(32))


class CheckpointRow(Base):
    """A signed C2SP checkpoint note. Sizes only grow; every checkpoint is kept."""

    __tablename__ = "checkpoints"

    tree_size: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    root_hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    note: Mapped[str] = mapped_column(Text)
    signed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SigningKey(Base):
    __tablename__ = "signing_keys"

    key_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    role: Mapped[str] = mapped_column(String(20))
    public_key: Mapped[bytes] = mapped_column(LargeBinary(32))
    log_index: Mapped[int] = mapped_column(ForeignKey("log_entries.idx"), unique=True)
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class KeyRevocation(Base):
    __tablename__ = "key_revocations"

    key_id: Mapped[str] = mapped_column(ForeignKey("signing_keys.key_id"), primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    log_index: Mapped[int] = mapped_column(ForeignKey("log_entries.idx"), unique=True)
    revoked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Fingerprint(Base):
    __tablename__ = "fingerprints"

    fingerprint_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("signing_keys.key_id"))
    log_index: Mapped[int] = mapped_column(ForeignKey("log_entries.idx"), unique=True)
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Record(Base):
    """Index row of an inference record; its signed envelope lives in ``log_entries``."""

    __tablename__ = "records"
    __table_args__ = (
        Index("ix_records_model_idx", "model", "log_index"),
        Index("ix_records_fingerprint_idx", "fingerprint_id", "log_index"),
        Index("ix_records_received_at", "received_at"),
    )

    request_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    log_index: Mapped[int] = mapped_column(ForeignKey("log_entries.idx"), unique=True)
    content_hash: Mapped[str] = mapped_column(String(71))
    fingerprint_id: Mapped[str] = mapped_column(ForeignKey("fingerprints.fingerprint_id"))
    key_id: Mapped[str] = mapped_column(ForeignKey("signing_keys.key_id"))
    model: Mapped[str] = mapped_column(String(300))
    tier: Mapped[int] = mapped_column(SmallInteger)
    pool: Mapped[str] = mapped_column(String(100))
    worker_id: Mapped[str] = mapped_column(String(100))
    endpoint: Mapped[str] = mapped_column(String(40))
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ApiToken(Base):
    """A bearer token (hash only). Not a ledger table: tokens can be revoked in place."""

    __tablename__ = "api_tokens"

    token_id: Mapped[str] = mapped_column(String(20), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(71), unique=True)
    name: Mapped[str] = mapped_column(String(100))
    scopes: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # None: never expires; otherwise refused from this instant on (migration 0006).
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Worker(Base):
    """A registered worker: its last signed heartbeat (kept, and re-verified on every read)
    and the columns it gives. Live state; ``key_id`` is the key that first registered it."""

    __tablename__ = "workers"
    __table_args__ = (Index("ix_workers_pool", "pool"),)

    worker_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    pool: Mapped[str] = mapped_column(String(100))
    url: Mapped[str] = mapped_column(String(500))
    fingerprint_id: Mapped[str] = mapped_column(String(80))
    key_id: Mapped[str] = mapped_column(String(80))
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    heartbeat: Mapped[bytes] = mapped_column(LargeBinary)
    heartbeat_issued_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Replay(Base):
    """Index row of a signed replay verdict (the verdict itself is a log leaf)."""

    __tablename__ = "replays"
    __table_args__ = (Index("ix_replays_request", "request_id", "log_index"),)

    replay_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    request_id: Mapped[str] = mapped_column(ForeignKey("records.request_id"))
    log_index: Mapped[int] = mapped_column(ForeignKey("log_entries.idx"), unique=True)
    verdict: Mapped[str] = mapped_column(String(40))
    pool: Mapped[str] = mapped_column(String(100))
    worker_id: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Certificate(Base):
    """Index row of a signed pool certificate (a log leaf)."""

    __tablename__ = "certificates"
    __table_args__ = (Index("ix_certificates_fingerprint", "fingerprint_id"),)

    certificate_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    pool: Mapped[str] = mapped_column(String(100))
    fingerprint_id: Mapped[str] = mapped_column(String(80))
    log_index: Mapped[int] = mapped_column(ForeignKey("log_entries.idx"), unique=True)
    invariant: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class CacheKey(Base):
    """A record indexed under a ``ck1`` cache key (see ``ledger.cachekey``)."""

    __tablename__ = "cache_keys"

    cache_key: Mapped[str] = mapped_column(String(80), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    log_index: Mapped[int] = mapped_column(BigInteger)
    tier: Mapped[int] = mapped_column(SmallInteger)
    deterministic: Mapped[bool] = mapped_column(Boolean)


class CertificationJob(Base):
    """A pool certification job (``ledger.storage.certification_jobs``). Live state, updated as
    the job runs; its signed certificate, once logged, is a leaf (``certificates``)."""

    __tablename__ = "certification_jobs"
    __table_args__ = (Index("ix_certification_jobs_state_lease", "state", "lease_until"),)

    certification_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    pool: Mapped[str] = mapped_column(String(100))
    worker_id: Mapped[str] = mapped_column(String(100))
    fingerprint_id: Mapped[str] = mapped_column(String(80))
    parameters: Mapped[str] = mapped_column(Text)  # JSON
    state: Mapped[str] = mapped_column(String(10))  # running | done | failed (a CHECK)
    done: Mapped[int] = mapped_column(BigInteger)
    total: Mapped[int] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON {"code", "message"}
    certificate_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    log_index: Mapped[int | None] = mapped_column(ForeignKey("log_entries.idx"), nullable=True)
    runner: Mapped[str] = mapped_column(String(200))  # the process that runs it
    # the display ID of the token that started it (None: started before revision 0012)
    started_by: Mapped[str | None] = mapped_column(String(100), nullable=True)
    lease_until: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Disclosure(Base):
    """A salted disclosure of a v2 record's content (``ledger.disclosures``), kept apart from
    the log: ``log_index`` is the leaf whose signed body holds its digest."""

    __tablename__ = "disclosures"
    __table_args__ = (Index("ix_disclosures_log_index", "log_index"),)

    request_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    digest: Mapped[str] = mapped_column(String(71), primary_key=True)
    log_index: Mapped[int] = mapped_column(ForeignKey("log_entries.idx"))
    disclosure: Mapped[str] = mapped_column(Text)


class Salt(Base):
    """The hashes of every disclosure salt the ledger accepted (each 16-byte window's:
    ``ledger.disclosures.salt_keys``), kept when the disclosure is erased: a salt used again
    by another record, or another replay output, is refused (its disclosure would confirm
    guesses of the first one's content). ``log_index``: the leaf that committed to it."""

    __tablename__ = "salts"

    salt_key: Mapped[bytes] = mapped_column(LargeBinary(32), primary_key=True)
    log_index: Mapped[int] = mapped_column(BigInteger)


class Erasure(Base):
    """Index row of a logged erasure event (one per record: it erases all of its content)."""

    __tablename__ = "erasures"

    request_id: Mapped[str] = mapped_column(ForeignKey("records.request_id"), primary_key=True)
    log_index: Mapped[int] = mapped_column(ForeignKey("log_entries.idx"), unique=True)
    reason_code: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Hold(Base):
    """Index row of a logged legal hold: on one request ID, or on a search filter (JSON)."""

    __tablename__ = "holds"

    hold_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    log_index: Mapped[int] = mapped_column(ForeignKey("log_entries.idx"), unique=True)
    request_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    filter: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class HoldRelease(Base):
    """Index row of a logged hold release."""

    __tablename__ = "hold_releases"

    hold_id: Mapped[str] = mapped_column(ForeignKey("holds.hold_id"), primary_key=True)
    log_index: Mapped[int] = mapped_column(ForeignKey("log_entries.idx"), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
