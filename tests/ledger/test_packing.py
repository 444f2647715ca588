import base64
import binascii
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import InvalidInput
from ledger.packing import (
    check_logprobs,
    check_token_ids,
    decode_packed,
    pack_float32,
    pack_float32_bytes,
    pack_int32,
    strict_b64decode,
    unpack_float32,
    unpack_int32,
)


def test_layout_is_little_endian():
    assert base64.b64decode(pack_int32([1, 256])) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    assert base64.b64decode(pack_float32([-1.0])) == struct.pack("<f", -1.0)


@given(st.lists(st.integers(-(2**31), 2**31 - 1)))
def test_int32_round_trip(values):
    assert unpack_int32(pack_int32(values)) == values


@given(st.lists(st.floats(width=32, allow_nan=False)))
def test_float32_round_trip_is_bit_exact(values):
    packed = pack_float32(values)
    back = unpack_float32(packed)
    assert struct.pack(f"<{len(values)}f", *back) == struct.pack(f"<{len(values)}f", *values)


def _reference_nonfinite(raw: bytes) -> int | None:
    for i, (v,) in enumerate(struct.iter_unpack("<f", raw)):
        if not math.isfinite(v):
            return i
    return None


@given(st.binary(max_size=64).map(lambda b: b[: len(b) - len(b) % 4]))
def test_nonfinite_detection_matches_a_reference(raw):
    expected = _reference_nonfinite(raw)
    if expected is None:
        assert check_logprobs(raw, "x") == len(raw) // 4
    else:
        with pytest.raises(InvalidInput) as err:
            check_logprobs(raw, "x")
        assert err.value.code == "invalid_logprobs"
        assert err.value.details["position"] == expected


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_logprobs_are_refused(bad):
    raw = decode_packed(pack_float32([-0.5, bad]), "lp")
    with pytest.raises(InvalidInput) as err:
        check_logprobs(raw, "lp")
    assert err.value.details == {"field": "lp", "position": 1}


@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=30))
def test_negative_token_id_detection(values):
    raw = decode_packed(pack_int32(values), "ids")
    negatives = [i for i, v in enumerate(values) if v < 0]
    if not negatives:
        assert check_token_ids(raw, "ids") == len(values)
    else:
        with pytest.raises(InvalidInput) as err:
            check_token_ids(raw, "ids")
        assert err.value.details["position"] == negatives[0]


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("not base64!", "invalid_packing"),
        ("AAAA AAA=", "invalid_packing"),
        ("AAA=", "invalid_packing"),  # 2 bytes: not a whole element
        (12, "schema_violation"),
    ],
)
def test_decode_is_strict(value, code):
    with pytest.raises(InvalidInput) as err:
        decode_packed(value, "f")
    assert err.value.code == code


def test_pack_raw_float_bytes_keeps_nan_payloads_bit_exact():
    raw = b"\x01\x00\xc0\x7f"  # a NaN with a payload: packing must not canonicalize it
    assert base64.b64decode(pack_float32_bytes(raw)) == raw
    with pytest.raises(InvalidInput):
        pack_float32_bytes(b"\x00")


def test_int32_overflow_is_refused():
    with pytest.raises(InvalidInput):
        pack_int32([2**31])


def _outcome(decode, text):
    try:
        return "decoded", decode(text)
    except (ValueError, UnicodeError):  # binascii.Error is a ValueError
        return "refused", b""


def _reference(text: str) -> bytes:
    return binascii.a2b_base64(text.encode("ascii"), strict_mode=True)


_B64_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ \n.\x00\u00e9"


@settings(max_examples=3000)
@given(st.one_of(st.text(alphabet=_B64_CHARS, max_size=14), st.binary(max_size=64)))
def test_packed_decoding_takes_and_refuses_what_the_strict_c_decoder_does(item):
    """Any text, and the encoding of any bytes with a stray, missing or extra character or
    padding: the SIMD path decodes exactly what ``binascii``'s strict mode decodes, to the
    same bytes, and refuses the rest (non-canonical trailing bits and stray ``=`` included)."""
    if isinstance(item, bytes):
        encoded = base64.b64encode(item).decode()
        texts = [
            encoded,
            encoded + "=",
            encoded + "A",
            encoded[:-1],
            "=" + encoded,
            encoded + "\n",
            encoded.rstrip("="),
            encoded[:4] + "=" + encoded[4:],
        ]
    else:
        texts = [item]
    for text in texts:
        assert _outcome(strict_b64decode, text) == _outcome(_reference, text), text
