"""RFC 9162 Merkle trees over a node-reading callback (pure: no storage imports).

Nodes are addressed as ``(level, index)``: the perfect subtree of ``2**level`` leaves that
starts at leaf ``index * 2**level``. Storage keeps the hash of every complete node, so

- an append reads only the tree's right frontier (at most log2(n) nodes) and writes the
  new leaf plus the parents it completes (two nodes per leaf on average);
- a root, an inclusion proof or a consistency proof needs O(log n) node hashes, all known
  up front: ``*_plan`` names them, one ``read_nodes`` call fetches them, and the proof is
  assembled in memory.

Verification follows RFC 9162 sections 2.1.3.2 and 2.1.4.2 and raises
:class:`ledger.errors.VerificationError`; it never returns a boolean.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

from ledger.errors import InvalidInput, VerificationError

LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
EMPTY_ROOT = hashlib.sha256(b"").digest()

Node = tuple[int, int]  # (level, index)
Range = tuple[int, int]  # leaves [start, end)
ReadNodes = Callable[[Sequence[Node]], dict[Node, bytes]]


def leaf_hash(entry: bytes) -> bytes:
    """SHA-256(0x00 || entry): the hash of one log leaf (entry = canonical envelope bytes)."""
    h = hashlib.sha256(LEAF_PREFIX)
    h.update(entry)  # no 0x00 || entry copy: entries are records of tens of KiB
    return h.digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right)."""
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def perfect_nodes(start: int, end: int) -> list[Node]:
    """Aligned perfect subtrees covering [start, end), left to right (RFC 9162 shape)."""
    nodes: list[Node] = []
    while start < end:
        size = 1 << ((end - start).bit_length() - 1)
        while start % size:
            size >>= 1
        nodes.append((size.bit_length() - 1, start // size))
        start += size
    return nodes


def from_hashes(hashes: dict[Node, bytes]) -> ReadNodes:
    """A ``read_nodes`` callback over hashes already fetched."""
    return lambda nodes: {node: hashes[node] for node in nodes}


def range_hash(start: int, end: int, hashes: dict[Node, bytes]) -> bytes:
    """MTH(D[start:end]) from the hashes of its perfect subtrees (a right fold)."""
    parts = perfect_nodes(start, end)
    acc = hashes[parts[-1]]
    for node in reversed(parts[:-1]):
        acc = node_hash(hashes[node], acc)
    return acc


def _check_size(tree_size: int) -> None:
    if tree_size < 0:
        raise InvalidInput("tree size must be >= 0", code="invalid_tree_size")


def root_plan(tree_size: int) -> list[Node]:
    _check_size(tree_size)
    return perfect_nodes(0, tree_size)


def root(tree_size: int, read_nodes: ReadNodes) -> bytes:
    """The root hash of the first ``tree_size`` leaves."""
    if tree_size == 0:
        return EMPTY_ROOT
    return range_hash(0, tree_size, read_nodes(root_plan(tree_size)))


def _inclusion_ranges(index: int, tree_size: int) -> list[Range]:
    """PATH(index, D[tree_size]) as leaf ranges, ordered from the leaf upwards."""
    if not 0 <= index < tree_size:
        raise InvalidInput(
            f"leaf index {index} is not in a tree of size {tree_size}", code="invalid_index"
        )
    out: list[Range] = []
    start, end = 0, tree_size
    while end - start > 1:
        k = _split(end - start)
        if index < start + k:
            out.append((start + k, end))
            end = start + k
        else:
            out.append((start, start + k))
            start += k
    out.reverse()
    return out


def _consistency_ranges(first: int, second: int) -> list[Range]:
    """PROOF(first, D[second]) as leaf ranges (RFC 9162 2.1.4.1), in proof order."""
    if not 0 <= first <= second:
        raise InvalidInput(
            f"consistency needs 0 <= first <= second, got {first} and {second}",
            code="invalid_tree_size",
        )
    if first in (0, second):
        return []
    out: list[Range] = []
    start, end, m, whole = 0, second, first, True
    while True:
        if m == end - start:
            if not whole:
                out.append((start, end))
            break
        k = _split(end - start)
        if m <= k:
            out.append((start + k, end))
            end = start + k
        else:
            out.append((start, start + k))
            start += k
            m -= k
            whole = False
    out.reverse()
    return out


def _plan(ranges: Iterable[Range]) -> list[Node]:
    seen: dict[Node, None] = {}
    for start, end in ranges:
        for node in perfect_nodes(start, end):
            seen[node] = None
    return list(seen)


def inclusion_plan(index: int, tree_size: int) -> list[Node]:
    return _plan(_inclusion_ranges(index, tree_size))


def inclusion_proof(index: int, tree_size: int, read_nodes: ReadNodes) -> list[bytes]:
    ranges = _inclusion_ranges(index, tree_size)
    hashes = read_nodes(_plan(ranges))
    return [range_hash(s, e, hashes) for s, e in ranges]


def consistency_proof(first: int, second: int, read_nodes: ReadNodes) -> list[bytes]:
    ranges = _consistency_ranges(first, second)
    if not ranges:
        return []
    hashes = read_nodes(_plan(ranges))
    return [range_hash(s, e, hashes) for s, e in ranges]


def append_plan(tree_size: int) -> list[Node]:
    """Existing nodes an append to a tree of ``tree_size`` leaves needs: its right frontier."""
    return perfect_nodes(0, tree_size)


def append_leaves(
    tree_size: int, leaf_hashes: Sequence[bytes], frontier: dict[Node, bytes]
) -> dict[Node, bytes]:
    """New nodes (leaves and the parents they complete) for appending ``leaf_hashes``.

    ``frontier`` holds the hashes of ``append_plan(tree_size)``.
    """
    known = dict(frontier)
    new: dict[Node, bytes] = {}
    for offset, h in enumerate(leaf_hashes):
        level, index = 0, tree_size + offset
        new[(level, index)] = known[(level, index)] = h
        while index & 1:
            parent = node_hash(known[(level, index - 1)], h)
            level, index = level + 1, index >> 1
            new[(level, index)] = known[(level, index)] = h = parent
    return new


def _check_hashes(hashes: Sequence[bytes], code: str) -> None:
    if set(map(type, hashes)) != {bytes} or set(map(len, hashes)) != {32}:
        raise VerificationError("every hash must be 32 bytes (SHA-256)", code=code)


def verify_inclusion(
    leaf: bytes, index: int, tree_size: int, proof: Sequence[bytes], root_hash: bytes
) -> None:
    """RFC 9162 2.1.3.2. Raises VerificationError unless ``leaf`` is at ``index``."""
    if not 0 <= index < tree_size:
        raise VerificationError(
            f"leaf index {index} is outside a tree of size {tree_size}", code="bad_inclusion_proof"
        )
    _check_hashes([leaf, root_hash, *proof], "bad_inclusion_proof")
    fn, sn, r = index, tree_size - 1, leaf
    sha256 = hashlib.sha256  # node_hash, inlined: a proof is up to 64 hashes
    for p in proof:
        if sn == 0:
            raise VerificationError("inclusion proof is too long", code="bad_inclusion_proof")
        if fn & 1 or fn == sn:
            r = sha256(NODE_PREFIX + p + r).digest()
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = sha256(NODE_PREFIX + r + p).digest()
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise VerificationError("inclusion proof is too short", code="bad_inclusion_proof")
    if r != root_hash:
        raise VerificationError(
            "inclusion proof does not lead to the root hash", code="bad_inclusion_proof"
        )


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> None:
    """RFC 9162 2.1.4.2. Raises VerificationError unless tree ``second`` extends ``first``."""
    if not 0 <= first <= second:
        raise VerificationError(
            f"consistency needs 0 <= first <= second, got {first} and {second}",
            code="bad_consistency_proof",
        )
    _check_hashes([first_root, second_root, *proof], "bad_consistency_proof")
    if first == second or first == 0:
        if proof:
            raise VerificationError(
                "consistency proof must be empty here", code="bad_consistency_proof"
            )
        if first == second and first_root != second_root:
            raise VerificationError(
                "trees of equal size have different roots", code="bad_consistency_proof"
            )
        if first == 0 and first_root != EMPTY_ROOT:
            raise VerificationError(
                "the root of the empty tree is SHA-256 of nothing", code="bad_consistency_proof"
            )
        return
    path = list(proof)
    if first & (first - 1) == 0:  # an exact power of two: the old root is a node of the new
        path.insert(0, first_root)
    if not path:
        raise VerificationError("consistency proof is empty", code="bad_consistency_proof")
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise VerificationError("consistency proof is too long", code="bad_consistency_proof")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise VerificationError("consistency proof is too short", code="bad_consistency_proof")
    if fr != first_root or sr != second_root:
        raise VerificationError(
            "consistency proof does not reproduce both roots", code="bad_consistency_proof"
        )
