"""The Merkle tree in storage: node reads for proofs, node writes for appends."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import bindparam, select, text, tuple_
from sqlalchemy.orm import Session

from ledger import merkle
from ledger.errors import StorageError
from ledger.storage.bulk import insert_rows
from ledger.storage.models import MerkleNode

_CHUNK = 400


def node_reader(session: Session) -> merkle.ReadNodes:
    """A ``read_nodes`` callback over this session: one query per call (chunked).

    Answered from the primary key: on Postgres a join against arrays of levels and indexes,
    on SQLite ``(level, idx) IN (...)``.
    """

    def read(nodes: Sequence[merkle.Node]) -> dict[merkle.Node, bytes]:
        wanted = list(dict.fromkeys(nodes))
        found = read_existing(session, wanted)
        missing = [n for n in wanted if n not in found]
        if missing:
            raise MissingNodes(missing)
        return found

    return read


def read_existing(
    session: Session, nodes: Sequence[merkle.Node], chunk: int = _CHUNK
) -> dict[merkle.Node, bytes]:
    """The stored hashes of those of ``nodes`` that exist (missing ones are left out)."""
    found: dict[merkle.Node, bytes] = {}
    postgres = session.get_bind().dialect.name == "postgresql"
    for start in range(0, len(nodes), chunk):
        part = list(nodes[start : start + chunk])
        if postgres:
            # A join against two arrays: one primary-key probe per node (a row-value IN list
            # becomes a BitmapOr of index scans, about three times slower at 40 nodes).
            params = {"levels": [n[0] for n in part], "idxs": [n[1] for n in part]}
            rows = session.execute(_READ_PG, params).all()
        else:
            rows = session.execute(_READ, {"nodes": part}).all()
        found.update({(r[0], r[1]): bytes(r[2]) for r in rows})
    return found


class MissingNodes(StorageError):
    """Nodes a proof needs are not stored: the tree is smaller than asked, or corrupt."""

    def __init__(self, missing: list[merkle.Node]) -> None:
        super().__init__(f"Merkle nodes missing from storage: {missing[:4]}", code="tree_corrupt")
        self.missing = missing


def read_ranges(session: Session, nodes: Sequence[merkle.Node]) -> dict[merkle.Node, bytes]:
    """Stored hashes for ``nodes`` by one primary-key range scan per level: the right read
    for the contiguous runs of nodes that a stretch of leaves completes."""
    spans: dict[int, tuple[int, int]] = {}
    for level, idx in nodes:
        lo, hi = spans.get(level, (idx, idx))
        spans[level] = (min(lo, idx), max(hi, idx))
    found: dict[merkle.Node, bytes] = {}
    for level, (lo, hi) in spans.items():
        rows = session.execute(
            select(MerkleNode.idx, MerkleNode.hash).where(
                MerkleNode.level == level, MerkleNode.idx.between(lo, hi)
            )
        ).all()
        found.update({(level, r[0]): bytes(r[1]) for r in rows})
    return found


_READ = select(MerkleNode.level, MerkleNode.idx, MerkleNode.hash).where(
    tuple_(MerkleNode.level, MerkleNode.idx).in_(bindparam("nodes", expanding=True))
)


_READ_PG = text(
    "SELECT m.level, m.idx, m.hash "
    "FROM unnest(CAST(:levels AS smallint[]), CAST(:idxs AS bigint[])) AS w(level, idx) "
    "JOIN merkle_nodes m ON m.level = w.level AND m.idx = w.idx"
)


def append_hashes(session: Session, tree_size: int, leaf_hashes: Sequence[bytes]) -> None:
    """Store the nodes that appending ``leaf_hashes`` to a tree of ``tree_size`` creates."""
    if not leaf_hashes:
        return
    frontier = node_reader(session)(merkle.append_plan(tree_size)) if tree_size else {}
    new = merkle.append_leaves(tree_size, leaf_hashes, frontier)
    insert_rows(
        session,
        MerkleNode,
        ("level", "idx", "hash"),
        [(level, idx, h) for (level, idx), h in new.items()],
    )


def root(session: Session, tree_size: int) -> bytes:
    return merkle.root(tree_size, node_reader(session))
