"""Small-order, off-curve and non-canonical Ed25519 public keys are refused when parsed."""

from __future__ import annotations

import base64
import functools

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import InvalidInput
from ledger.signing import (
    SigningKey,
    cached_verifying_key,
    check_public_key,
    load_public_key,
    public_key_pem,
    public_key_raw,
)

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493

# The canonical encodings of the 8 points of small order (libsodium's blocklist, which names
# each y once: the sign bit, the x of +-x, is flipped below), and the non-canonical ones
# (y >= p) of the points with y = 0 and y = 1.
SMALL_ORDER = {
    "identity (order 1)": (1).to_bytes(32, "little"),
    "all-zero: y = 0 (order 4)": bytes(32),
    "order 8, first": bytes.fromhex(
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"
    ),
    "order 8, second": bytes.fromhex(
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"
    ),
    "y = p - 1 (order 2)": (P - 1).to_bytes(32, "little"),
    "y = p, non-canonical 0 (order 4)": P.to_bytes(32, "little"),
    "y = p + 1, non-canonical 1 (order 1)": (P + 1).to_bytes(32, "little"),
}


def _with_sign(raw: bytes) -> bytes:
    return raw[:31] + bytes([raw[31] | 0x80])


def _text(raw: bytes) -> str:
    return "ed25519:" + base64.b64encode(raw).decode()


def _pem(raw: bytes) -> str:
    # cryptography builds a key object from any 32 bytes: the PEM is a real SPKI document
    return public_key_pem(Ed25519PublicKey.from_public_bytes(raw))


@pytest.mark.parametrize("name", sorted(SMALL_ORDER))
@pytest.mark.parametrize("signed", [False, True])
def test_small_order_points_are_weak_in_every_encoding(name: str, signed: bool):
    raw = _with_sign(SMALL_ORDER[name]) if signed else SMALL_ORDER[name]
    for form in (_text(raw), _pem(raw), raw.hex()):
        if form == raw.hex():
            with pytest.raises(InvalidInput) as err:
                check_public_key(raw)
        else:
            with pytest.raises(InvalidInput) as err:
                load_public_key(form)
        assert err.value.code == "weak_public_key", (name, signed, form)
    with pytest.raises(InvalidInput) as cached:
        cached_verifying_key(_text(raw))
    assert cached.value.code == "weak_public_key"


@functools.cache
def _small_order_by_multiplication() -> frozenset[bytes]:
    """All 8 torsion points, found independently of the checker: [L]Q for points Q."""
    d = -121665 * pow(121666, P - 2, P) % P
    sqrt_m1 = pow(2, (P - 1) // 4, P)

    def recover_x(y: int) -> int | None:
        x2 = (y * y - 1) * pow(d * y * y + 1, P - 2, P) % P
        x = pow(x2, (P + 3) // 8, P)
        if (x * x - x2) % P:
            x = x * sqrt_m1 % P
        return x if (x * x - x2) % P == 0 else None

    def add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:  # affine Edwards
        (x1, y1), (x2, y2) = a, b
        t = d * x1 * x2 * y1 * y2 % P
        x3 = (x1 * y2 + x2 * y1) * pow(1 + t, P - 2, P) % P
        y3 = (y1 * y2 + x1 * x2) * pow(1 - t, P - 2, P) % P
        return x3, y3

    def mul(k: int, q: tuple[int, int]) -> tuple[int, int]:
        acc, base = (0, 1), q
        while k:
            if k & 1:
                acc = add(acc, base)
            base, k = add(base, base), k >> 1
        return acc

    found: set[bytes] = set()
    y = 2
    while len(found) < 8 and y < 200:
        x = recover_x(y)
        if x is not None:
            tx, ty = mul(L, (x, y))  # the torsion component of (x, y)
            for point in [(tx, ty)] + [mul(i, (tx, ty)) for i in range(2, 9)]:
                px, py = point
                found.add((py | ((px & 1) << 255)).to_bytes(32, "little"))
        y += 1
    return frozenset(found)


def test_the_checker_refuses_exactly_the_torsion_points_found_by_multiplication():
    torsion = _small_order_by_multiplication()
    assert len(torsion) == 8
    assert bytes(32) in torsion and (1).to_bytes(32, "little") in torsion
    for raw in torsion:
        with pytest.raises(InvalidInput) as err:
            check_public_key(raw)
        assert err.value.code == "weak_public_key"


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=32, max_size=32))
def test_any_32_bytes_are_accepted_only_as_a_canonical_point_of_large_order(raw: bytes):
    try:
        check_public_key(raw)
    except InvalidInput as exc:
        assert exc.code in ("invalid_public_key", "weak_public_key")
        return
    n = int.from_bytes(raw, "little")
    assert n & ((1 << 255) - 1) < P  # canonical y
    assert raw not in _small_order_by_multiplication()


def test_real_keys_are_accepted_in_both_forms():
    for _ in range(20):
        key = SigningKey.generate()
        raw = public_key_raw(key.public_key)
        check_public_key(raw)
        assert public_key_raw(load_public_key(_text(raw))) == raw
        assert public_key_raw(load_public_key(public_key_pem(key.public_key))) == raw


def test_off_curve_and_non_canonical_encodings_are_invalid():
    off_curve = next(
        y.to_bytes(32, "little")
        for y in range(2, 100)
        if _raises_code(y.to_bytes(32, "little")) == "invalid_public_key"
    )
    assert _raises_code(off_curve) == "invalid_public_key"
    # y + p for a y < 19 that is on the curve with large order: the same point, encoded
    # non-canonically (RFC 8032 5.1.3 refuses it)
    on_curve = [y for y in range(2, 19) if _raises_code(y.to_bytes(32, "little")) is None]
    assert on_curve
    for y in on_curve:
        assert _raises_code((y + P).to_bytes(32, "little")) == "invalid_public_key"
    # x = 0 with the sign bit set is a non-canonical encoding too; both such points (y = +-1)
    # are of small order, so they are weak first
    assert _raises_code(_with_sign((1).to_bytes(32, "little"))) == "weak_public_key"


def _raises_code(raw: bytes) -> str | None:
    try:
        check_public_key(raw)
    except InvalidInput as exc:
        return exc.code
    return None


@pytest.mark.parametrize(
    "text",
    [
        "\ud800",
        "-----BEGIN PUBLIC KEY-----\ud800",
        "ed25519:" + "A" * 43,
        "ed25519:" + base64.b64encode(bytes(31)).decode(),
        "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----",
    ],
)
def test_unparseable_key_texts_are_invalid_input(text: str):
    with pytest.raises(InvalidInput) as err:
        load_public_key(text)
    assert err.value.code == "invalid_public_key"


def test_a_non_ed25519_pem_is_refused():
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    with pytest.raises(InvalidInput) as err:
        load_public_key(pem)
    assert err.value.code == "invalid_public_key"
