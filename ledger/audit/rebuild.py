"""The log's tree rebuilt from its leaves, compared with the stored nodes as it grows.

The audit's hot loop (``--structure-only`` is little else): leaf hashes are computed and
compared a chunk at a time, the tree is extended level by level for the chunk (cut at every
checkpoint size inside it, whose roots are kept), and the nodes the chunk completes are
compared with the stored ones per level, as concatenations (``AuditReader.node_runs``, read
ahead); only a level that differs is read node by node to name the bad node.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterator

from ledger import merkle
from ledger.audit.report import Finding
from ledger.audit.rows import LeafChunk, Runs, Spans

_LEAF_DIFFERS = "stored leaf hash differs from the hash of the stored envelope"
_LEAF_STATE = hashlib.sha256(merkle.LEAF_PREFIX)
ReadLevels = Callable[[Spans], dict[int, list[tuple[int, bytes]]]]


def completed(start: int, end: int) -> Spans:
    """The nodes that leaves ``start`` .. ``end - 1`` complete, appended to a tree of ``start``
    leaves: at each level, from the node holding leaf ``start`` to the last one ending by
    ``end``."""
    spans: Spans = {}
    level = 0
    while (end >> level) - 1 >= start >> level:
        spans[level] = (start >> level, (end >> level) - 1)
        level += 1
    return spans


def planned(chunk: int) -> Iterator[Spans]:
    """For chunk 0, 1, 2, ... of a scan: the nodes it completes if it holds leaves
    ``k * chunk`` onwards (what is read ahead for it)."""
    start = 0
    while True:
        yield completed(start, start + chunk)
        start += chunk


_INTEGERS = {int}
_LEAF_HASH = ("log_entries", "leaf_hash")  # where a finding's stored value is


class Rebuild:
    """The rebuilt tree's right edge, the nodes not yet compared, and the kept roots."""

    def __init__(self, wanted: set[int], found: list[Finding]) -> None:
        self.wanted_set = wanted
        self.wanted = sorted(wanted)
        self.found = found
        # level -> hash of the complete node at that level on the right edge
        self.frontier: dict[int, bytes] = {}
        self.size = 0  # leaves pushed so far
        self.expected = 0  # the next index a contiguous log holds
        # nodes rebuilt but not yet compared with the stored ones: level -> (first, hashes)
        self.pending: dict[int, tuple[int, list[bytes]]] = {}
        self.bad_nodes: set[merkle.Node] = set()
        self.roots: dict[int, bytes] = {}

    def add(self, chunk: LeafChunk) -> None:
        """Sequence and leaf hashes of one chunk, and the tree extended by it."""
        indexes, expected = chunk.indexes, self.expected
        if (
            indexes[0] == expected
            and indexes[-1] == expected + len(indexes) - 1
            and set(map(type, indexes)) == _INTEGERS  # SQLite may hold 3.5 between 2 and 4
        ):
            # indexes are unique, sorted integers: these are exactly the next ones
            self._contiguous(chunk)
            self.expected = expected + len(indexes)
        else:
            self._out_of_sequence(chunk)

    def _contiguous(self, chunk: LeafChunk) -> None:
        # SHA-256(0x00 || entry) from a copy of the hash state after 0x00: no copy of the
        # entry (prefix + entry), about a tenth less time per leaf than concatenating
        leaves: list[bytes] = []
        append, start = leaves.append, _LEAF_STATE.copy
        for data in chunk.envelopes:
            h = start()
            h.update(data)
            append(h.digest())
        if b"".join(leaves) != b"".join(chunk.leaf_hashes):
            for idx, stored, leaf in zip(chunk.indexes, chunk.leaf_hashes, leaves, strict=True):
                if leaf != stored:
                    self.found.append(Finding("leaf_hash", _LEAF_DIFFERS, idx, *_LEAF_HASH))
        expected, wanted = self.expected, self.wanted
        done = 0
        at = bisect.bisect_right(wanted, expected)
        while at < len(wanted) and wanted[at] <= expected + len(leaves):
            cut = wanted[at] - expected
            self._extend(leaves[done:cut])
            self.roots[wanted[at]] = self.root()
            done, at = cut, at + 1
        self._extend(leaves[done:])

    def _out_of_sequence(self, chunk: LeafChunk) -> None:
        """Leaf by leaf, for rows whose indexes skip: each gap is a finding, and the tree is
        rebuilt from the rows as they are."""
        expected = self.expected
        for idx, stored, data in zip(
            chunk.indexes, chunk.leaf_hashes, chunk.envelopes, strict=True
        ):
            if type(idx) is not int:  # as stored: SQLite keeps 3.5 or text in any column
                self.found.append(
                    Finding(
                        "sequence",
                        f"expected leaf {expected}, found a row whose idx is {idx!r}",
                        expected,
                        table="log_entries",
                        column="idx",
                    )
                )
                continue  # no place in the tree: nothing else of it is compared
            if idx != expected:
                self.found.append(
                    Finding(
                        "sequence",
                        f"expected leaf {expected}, found leaf {idx}",
                        expected,
                        "log_entries",
                        "idx",
                    )
                )
                expected = idx
            leaf = merkle.leaf_hash(data)
            self._extend([leaf])
            if leaf != stored:
                self.found.append(Finding("leaf_hash", _LEAF_DIFFERS, idx, *_LEAF_HASH))
            expected += 1
            if expected in self.wanted_set:
                self.roots[expected] = self.root()
        self.expected = expected

    def _extend(self, leaves: list[bytes]) -> None:
        """Append leaf hashes, level by level; every node they complete is queued for
        comparison (the nodes a stretch of leaves completes are contiguous runs)."""
        frontier, pending = self.frontier, self.pending
        sha256, prefix = hashlib.sha256, merkle.NODE_PREFIX
        level, start, items = 0, self.size, leaves
        while items:
            run = pending.get(level)
            if run is None:
                pending[level] = (start, list(items))
            else:
                run[1].extend(items)
            if start & 1:  # the left sibling is the complete node on the old right edge
                items = [frontier[level], *items]
                start -= 1
            pairs = zip(items[::2], items[1::2], strict=False)  # an odd last node stays
            items = [sha256(prefix + a + b).digest() for a, b in pairs]
            level += 1
            start >>= 1
        self.size = size = self.size + len(leaves)
        # The new right edge: one complete node per set bit of the size, rebuilt just now or,
        # when not, the same node the old edge held.
        edge: dict[int, bytes] = {}
        for level in range(size.bit_length()):
            if size >> level & 1:
                index = (size >> level) - 1
                run = pending.get(level)
                if run is not None and run[0] <= index < run[0] + len(run[1]):
                    edge[level] = run[1][index - run[0]]
                else:
                    edge[level] = frontier[level]
        self.frontier = edge

    def root(self) -> bytes:
        frontier = self.frontier
        if not frontier:
            return merkle.EMPTY_ROOT
        levels = sorted(frontier)
        acc = frontier[levels[0]]
        for level in levels[1:]:
            acc = merkle.node_hash(frontier[level], acc)
        return acc

    def compare(
        self,
        spans_ahead: Spans,
        runs_ahead: Runs,
        read_runs: Callable[[Spans], Runs],
        read_levels: ReadLevels,
    ) -> None:
        """Compare the rebuilt nodes with the stored ones (proofs are served from those):
        the runs read ahead when the chunk was where it was expected, else read now; one
        comparison per level, node by node only where a level differs."""
        pending = self.pending
        if not pending:
            return
        spans = {level: (first, first + len(run) - 1) for level, (first, run) in pending.items()}
        runs = runs_ahead if spans == spans_ahead else read_runs(spans)
        if all(
            runs.get(level) == (len(hashes), b"".join(hashes))
            for level, (_, hashes) in pending.items()
        ):
            pending.clear()
            return
        stored = read_levels(spans)
        held = {(level, idx): h for level, rows in stored.items() for idx, h in rows}
        bad = self.bad_nodes
        for level in sorted(pending):
            first, hashes = pending[level]
            for index, h in enumerate(hashes, first):
                node = (level, index)
                if level and ((level - 1, 2 * index) in bad or (level - 1, 2 * index + 1) in bad):
                    bad.add(node)  # already reported below it
                    continue
                got = held.get(node)
                if got != h:
                    bad.add(node)
                    what = (
                        "is missing"
                        if got is None
                        else "differs from the node rebuilt from the leaves"
                    )
                    self.found.append(
                        Finding(
                            "tree",
                            f"stored Merkle node {node} {what}",
                            index << level,
                            "merkle_nodes",
                            "hash",
                        )
                    )
        pending.clear()
