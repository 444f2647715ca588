"""What the audit reads: one named row type per ledger table, and the reader that scans them.

The audit core never opens a database. It asks an :class:`AuditReader` for scans, the way
``ledger.merkle`` asks a ``ReadNodes`` callback for node hashes; ``ledger/storage/
audit_reader.py`` is the only adapter. Rows are ``NamedTuple``s (immutable, named, cheap to
build a million of and to pickle to worker processes); the log itself arrives as
:class:`LeafChunk` columns, because the hot loop hashes whole columns.

Every time is an integer: microseconds since 1970-01-01T00:00:00Z (:data:`Micros`), or
``None`` where the stored value is not a time at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol

from ledger import merkle

Micros = int
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MICRO = timedelta(microseconds=1)


def micros(at: datetime) -> Micros:
    """An aware time as :data:`Micros` (a naive one is taken as UTC, as SQLite returns it)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return (at - EPOCH) // _ONE_MICRO


def as_time(value: Micros | None) -> str:
    """RFC 3339 text of a :data:`Micros` value, for messages."""
    if value is None:
        return "(not a time)"
    try:
        return (EPOCH + timedelta(microseconds=value)).isoformat().replace("+00:00", "Z")
    except OverflowError:
        return f"{value} µs after 1970"


@dataclass(frozen=True)
class LeafChunk:
    """Consecutive ``log_entries`` rows in index order, as columns.

    ``appended_at`` counts microseconds from ``time_origin`` (itself :data:`Micros`): a
    reader whose database counts from another instant hands its integers over as they are,
    and the audit moves its bounds instead of every time (:meth:`time` gives the Micros).
    ``kinds`` is ``None`` in a structure-only scan (which never parses an envelope).
    """

    indexes: Sequence[int]
    leaf_hashes: Sequence[bytes]
    envelopes: Sequence[bytes]
    appended_at: Sequence[int | None]
    kinds: Sequence[str] | None = None
    time_origin: Micros = 0

    def __len__(self) -> int:
        return len(self.indexes)

    def time(self, pos: int) -> Micros | None:
        at = self.appended_at[pos]
        return None if at is None else at + self.time_origin

    def integral(self) -> LeafChunk:
        """The chunk without rows whose index is no integer (SQLite keeps 3.5 or text in any
        column): the rebuild names those; nothing else can place them in the log."""
        if all(type(i) is int for i in self.indexes):
            return self
        keep = [n for n, i in enumerate(self.indexes) if type(i) is int]
        return LeafChunk(
            [self.indexes[n] for n in keep],
            [self.leaf_hashes[n] for n in keep],
            [self.envelopes[n] for n in keep],
            [self.appended_at[n] for n in keep],
            [self.kinds[n] for n in keep] if self.kinds is not None else None,
            self.time_origin,
        )


class CheckpointRow(NamedTuple):
    tree_size: int
    root_hash: bytes
    note: str
    signed_at: Micros | None


class RecordRow(NamedTuple):
    request_id: str
    log_index: int
    content_hash: str
    fingerprint_id: str
    key_id: str
    model: str
    tier: int
    pool: str
    worker_id: str
    endpoint: str
    received_at: Micros | None


class CacheKeyRow(NamedTuple):
    cache_key: str
    request_id: str
    log_index: int
    tier: int
    deterministic: bool


class FingerprintRow(NamedTuple):
    fingerprint_id: str
    key_id: str
    log_index: int
    registered_at: Micros | None


class KeyRow(NamedTuple):
    key_id: str
    name: str
    role: str
    public_key: bytes
    log_index: int
    registered_at: Micros | None


class RevocationRow(NamedTuple):
    key_id: str
    reason: str
    log_index: int
    revoked_at: Micros | None


class ReplayRow(NamedTuple):
    replay_id: str
    request_id: str
    log_index: int
    verdict: str
    pool: str
    worker_id: str
    created_at: Micros | None
    # Columns the table has beyond these, (name, value): each is compared with the verdict
    # body's member of the same name where the body has one (tables grow; bodies too).
    extra: tuple[tuple[str, Any], ...] = ()


class CertificateRow(NamedTuple):
    certificate_id: str
    pool: str
    fingerprint_id: str
    log_index: int
    invariant: bool
    created_at: Micros | None


class DisclosureRow(NamedTuple):
    request_id: str
    digest: str
    log_index: int
    disclosure: str


class ErasureRow(NamedTuple):
    request_id: str
    log_index: int
    reason_code: str
    created_at: Micros | None


class HoldRow(NamedTuple):
    hold_id: str
    log_index: int
    request_id: str | None
    filter: str | None
    created_at: Micros | None


class HoldReleaseRow(NamedTuple):
    hold_id: str
    log_index: int
    created_at: Micros | None


Spans = dict[int, tuple[int, int]]  # level -> (first, last) node index, inclusive
Runs = dict[int, tuple[int, bytes]]  # level -> (nodes stored, their hashes concatenated)


class AuditReader(Protocol):
    """Scans of every ledger table. Streams come in ``log_index`` order (cache keys: then
    ``cache_key``), ``chunk`` rows at a time, and may read ahead of the consumer."""

    def log_size(self) -> int:
        """Leaves in the log now (the highest index + 1)."""
        ...

    def protections(self) -> list[tuple[str | None, str]]:
        """(table or None, what is wrong) for each guard of the database that is not as the
        ledger installed it (``ledger.storage.protections``)."""
        ...

    def checkpoints(self) -> list[CheckpointRow]:
        """Every stored checkpoint, by tree size."""
        ...

    def leaves(self, chunk: int, *, kinds: bool) -> Iterator[LeafChunk]:
        """Every log entry in index order, from one read transaction."""
        ...

    def node_runs(self, spans: Iterable[Spans]) -> Iterator[Runs]:
        """For each spans (level -> node index range) in turn: per level, the number of stored
        32-byte hashes in the range and all of them concatenated in index order."""
        ...

    def node_levels(self, spans: Spans) -> dict[int, list[tuple[int, bytes]]]:
        """Stored ``(index, hash)`` pairs per level in the ranges, in index order."""
        ...

    def read_nodes(self, nodes: Sequence[merkle.Node]) -> dict[merkle.Node, bytes]:
        """A ``merkle.ReadNodes`` callback; raises ``LedgerError`` if a node is missing."""
        ...

    def tree_shape(self) -> tuple[int, dict[int, tuple[int, int, int]]]:
        """The log's size and, per level of stored nodes, their count and lowest and highest
        index, read together (one snapshot)."""
        ...

    def records(self, chunk: int) -> Iterator[Sequence[RecordRow]]: ...

    def cache_keys(self, chunk: int) -> Iterator[Sequence[CacheKeyRow]]: ...

    def fingerprints(self, chunk: int) -> Iterator[Sequence[FingerprintRow]]: ...

    def replays(self, chunk: int) -> Iterator[Sequence[ReplayRow]]: ...

    def certificates(self, chunk: int) -> Iterator[Sequence[CertificateRow]]: ...

    def disclosures(self, chunk: int) -> Iterator[Sequence[DisclosureRow]]: ...

    def erasures(self, chunk: int) -> Iterator[Sequence[ErasureRow]]: ...

    def holds(self, chunk: int) -> Iterator[Sequence[HoldRow]]: ...

    def hold_releases(self, chunk: int) -> Iterator[Sequence[HoldReleaseRow]]: ...

    def content_left(self, request_ids: Sequence[str]) -> dict[str, int]:
        """Disclosure and cache-key rows still held per request ID (those with any)."""
        ...

    def record_rows(self, request_ids: Sequence[str]) -> list[RecordRow]:
        """The ``records`` rows of these request IDs."""
        ...

    def committed_digests(self, records: Sequence[tuple[str, int | None]]) -> dict[str, set[str]]:
        """Per (request ID, record leaf): the digests the record's leaf commits to and the
        ``output_digest`` of each replay verdict leaf about it (read from the leaves)."""
        ...

    def signing_keys(self) -> list[KeyRow]: ...

    def revocations(self) -> list[RevocationRow]: ...
