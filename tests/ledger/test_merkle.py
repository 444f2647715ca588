"""The Merkle code against a naive RFC 9162 reference, for every tree size up to 300."""

from __future__ import annotations

import functools
import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import InvalidInput, VerificationError
from ledger.merkle import (
    EMPTY_ROOT,
    append_leaves,
    append_plan,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root,
    verify_consistency,
    verify_inclusion,
)

MAX = 300


def ref_mth(leaves: list[bytes]) -> bytes:
    """MTH(D[n]) straight from RFC 9162 2.1.1 (memoized on the leaf tuple)."""
    return _ref_mth(tuple(leaves))


@functools.cache
def _ref_mth(leaves: tuple[bytes, ...]) -> bytes:
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return leaves[0]
    k = 1 << ((n - 1).bit_length() - 1)
    return node_hash(_ref_mth(leaves[:k]), _ref_mth(leaves[k:]))


def ref_path(m: int, leaves: list[bytes]) -> list[bytes]:
    """PATH(m, D[n]), RFC 9162 2.1.3.1."""
    n = len(leaves)
    if n == 1:
        return []
    k = 1 << ((n - 1).bit_length() - 1)
    if m < k:
        return [*ref_path(m, leaves[:k]), ref_mth(leaves[k:])]
    return [*ref_path(m - k, leaves[k:]), ref_mth(leaves[:k])]


def ref_subproof(m: int, leaves: list[bytes], whole: bool) -> list[bytes]:
    """SUBPROOF(m, D[n], b), RFC 9162 2.1.4.1."""
    n = len(leaves)
    if m == n:
        return [] if whole else [ref_mth(leaves)]
    k = 1 << ((n - 1).bit_length() - 1)
    if m <= k:
        return [*ref_subproof(m, leaves[:k], whole), ref_mth(leaves[k:])]
    return [*ref_subproof(m - k, leaves[k:], False), ref_mth(leaves[:k])]


LEAVES = [leaf_hash(f"entry {i}".encode()) for i in range(MAX)]


def build(n: int) -> dict:
    """Store built by appending in uneven batches, as the ledger does."""
    store: dict = {}
    size, step = 0, 1
    while size < n:
        batch = LEAVES[size : min(n, size + step)]
        frontier = {node: store[node] for node in append_plan(size)}
        store.update(append_leaves(size, batch, frontier))
        size += len(batch)
        step = step % 7 + 1
    return store


STORE = build(MAX)
reads: list[int] = []


def read_nodes(nodes):
    reads.append(len(nodes))
    return {node: STORE[node] for node in nodes}


def test_empty_tree_root():
    assert root(0, read_nodes) == EMPTY_ROOT == ref_mth([])


@pytest.mark.parametrize("n", range(1, MAX + 1))
def test_roots_and_every_inclusion_proof(n):
    leaves = LEAVES[:n]
    expected_root = ref_mth(leaves)
    assert root(n, read_nodes) == expected_root
    for m in range(n):
        proof = inclusion_proof(m, n, read_nodes)
        assert proof == ref_path(m, leaves)
        verify_inclusion(leaves[m], m, n, proof, expected_root)


@pytest.mark.parametrize("n", range(1, MAX + 1))
def test_every_consistency_proof(n):
    leaves = LEAVES[:n]
    second_root = ref_mth(leaves)
    for m in range(1, n + 1):
        proof = consistency_proof(m, n, read_nodes)
        assert proof == (ref_subproof(m, leaves, True) if m < n else [])
        verify_consistency(m, n, ref_mth(leaves[:m]), second_root, proof)


def test_proofs_read_logarithmically_many_nodes():
    reads.clear()
    inclusion_proof(123, MAX, read_nodes)
    consistency_proof(77, MAX, read_nodes)
    assert reads[0] <= 2 * (MAX.bit_length()) and reads[1] <= 2 * (MAX.bit_length())


def flip(b: bytes) -> bytes:
    return bytes([b[0] ^ 1]) + b[1:]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_inclusion_verification_refuses_every_alteration(data):
    n = data.draw(st.integers(2, MAX))
    m = data.draw(st.integers(0, n - 1))
    leaves = LEAVES[:n]
    r = ref_mth(leaves)
    proof = inclusion_proof(m, n, read_nodes)
    other = ref_mth(LEAVES[: n - 1]) if n > 1 else EMPTY_ROOT
    bad = [
        (leaves[m], m, n, [flip(proof[0]), *proof[1:]], r),  # flipped bit in the proof
        (flip(leaves[m]), m, n, proof, r),  # another leaf
        (leaves[m], (m + 1) % n, n, proof, r),  # wrong index
        # wrong tree size, with that size's real root
        (leaves[m], m, n - 1, proof, ref_mth(leaves[: n - 1])) if m < n - 1 else None,
        (leaves[m], m, n, proof[:-1], r),  # truncated
        (leaves[m], m, n, [*proof, proof[-1]], r),  # padded
        (leaves[m], m, n, proof, other),  # a proof for another tree
    ]
    for args in bad:
        if args is None:
            continue
        with pytest.raises(VerificationError):
            verify_inclusion(*args)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_consistency_verification_refuses_every_alteration(data):
    n = data.draw(st.integers(3, MAX))
    m = data.draw(st.integers(1, n - 1))
    r1, r2 = ref_mth(LEAVES[:m]), ref_mth(LEAVES[:n])
    proof = consistency_proof(m, n, read_nodes)
    bad = [
        (m, n, r1, r2, [flip(proof[0]), *proof[1:]]),
        (m, n, flip(r1), r2, proof),
        (m, n, r1, flip(r2), proof),
        (m, n, r1, r2, proof[:-1]),
        (m, n, r1, r2, [*proof, proof[-1]]),
        (m + 1, n, ref_mth(LEAVES[: m + 1]), r2, proof) if m + 1 < n else None,
        (m, n - 1, r1, ref_mth(LEAVES[: n - 1]), proof) if m < n - 1 else None,
    ]
    for args in bad:
        if args is None:
            continue
        with pytest.raises(VerificationError):
            verify_consistency(*args)


def test_bad_arguments():
    with pytest.raises(InvalidInput):
        inclusion_proof(5, 5, read_nodes)
    with pytest.raises(InvalidInput):
        consistency_proof(6, 5, read_nodes)
    with pytest.raises(VerificationError):
        verify_inclusion(LEAVES[0], 0, 0, [], EMPTY_ROOT)
    with pytest.raises(VerificationError):
        verify_consistency(2, 2, LEAVES[0], LEAVES[1], [])


def test_leaf_and_node_hashes_are_rfc9162s():
    entry = b"x" * 100_000
    assert leaf_hash(entry) == hashlib.sha256(b"\x00" + entry).digest()
    assert (
        node_hash(LEAVES[0], LEAVES[1]) == hashlib.sha256(b"\x01" + LEAVES[0] + LEAVES[1]).digest()
    )


def test_hash_lengths_and_the_empty_tree_are_checked():
    with pytest.raises(VerificationError):
        verify_inclusion(LEAVES[0], 0, 2, [LEAVES[1][:31]], ref_mth(LEAVES[:2]))
    for not_bytes in (bytearray(LEAVES[1]), LEAVES[1].hex()):
        with pytest.raises(VerificationError):
            verify_inclusion(LEAVES[0], 0, 2, [not_bytes], ref_mth(LEAVES[:2]))
    verify_inclusion(LEAVES[0], 0, 2, [LEAVES[1]], ref_mth(LEAVES[:2]))
    with pytest.raises(VerificationError):
        verify_consistency(0, 5, LEAVES[0], ref_mth(LEAVES[:5]), [])
    verify_consistency(0, 5, EMPTY_ROOT, ref_mth(LEAVES[:5]), [])
