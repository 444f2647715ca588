"""The Merkle tree in storage: node reads for proofs, node writes for appends."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import and_, bindparam, or_, select, text, tuple_
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
        found.update({(r[0], r[1]): r[2] if type(r[2]) is bytes else b"" for r in rows})
    return found


class MissingNodes(StorageError):
    """Nodes a proof needs are not stored: the tree is smaller than asked, or corrupt."""

    def __init__(self, missing: list[merkle.Node]) -> None:
        super().__init__(f"Merkle nodes missing from storage: {missing[:4]}", code="tree_corrupt")
        self.missing = missing


def read_levels(
    session: Session, spans: dict[int, tuple[int, int]]
) -> dict[int, list[tuple[int, bytes]]]:
    """Stored ``(index, hash)`` pairs per level for the index ranges ``spans`` (level ->
    (first, last), inclusive), in index order: one query for all levels."""
    found: dict[int, list[tuple[int, bytes]]] = {level: [] for level in spans}
    if not spans:
        return found
    rows = session.execute(
        select(MerkleNode.level, MerkleNode.idx, MerkleNode.hash)
        .where(
            or_(
                *(
                    and_(MerkleNode.level == level, MerkleNode.idx.between(lo, hi))
                    for level, (lo, hi) in spans.items()
                )
            )
        )
        .order_by(MerkleNode.level, MerkleNode.idx)
    )
    for level, idx, h in rows:
        # as stored: a hash SQLite holds as another type is no hash (never bytes(2**40))
        found[level].append((idx, h if type(h) is bytes else b""))
    return found


# LATERAL: one primary-key range scan per level (a plain join is planned as a full scan).
_RUNS_PG = text(
    "SELECT w.level, a.n, a.hashes "
    "FROM unnest(CAST(:levels AS smallint[]), CAST(:los AS bigint[]), CAST(:his AS bigint[])) "
    "AS w(level, lo, hi) CROSS JOIN LATERAL ("
    "SELECT count(*) FILTER (WHERE length(m.hash) = 32) AS n, "
    "string_agg(m.hash, ''::bytea ORDER BY m.idx) AS hashes "
    "FROM merkle_nodes m WHERE m.level = w.level AND m.idx BETWEEN w.lo AND w.hi) AS a"
)


def read_runs(session: Session, spans: dict[int, tuple[int, int]]) -> dict[int, tuple[int, bytes]]:
    """Per level, how many nodes with a 32-byte hash are stored in the index range
    ``spans[level]`` (first, last; inclusive), and all their hashes concatenated in index
    order (a hash of another length cannot hide in the concatenation: it is not counted).
    On Postgres the database concatenates them (a few rows per call, not one per node)."""
    if not spans:
        return {}
    if session.get_bind().dialect.name != "postgresql":
        return {
            level: (sum(len(h) == 32 for _, h in rows), b"".join(h for _, h in rows))
            for level, rows in read_levels(session, spans).items()
        }
    levels = list(spans)
    rows = session.execute(
        _RUNS_PG,
        {
            "levels": levels,
            "los": [spans[level][0] for level in levels],
            "his": [spans[level][1] for level in levels],
        },
    )
    return {int(level): (int(count), bytes(hashes or b"")) for level, count, hashes in rows}


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
