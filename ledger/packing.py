"""Packed numeric arrays: base64 of little-endian int32 / float32 bytes.

Token IDs and logprobs travel in signed documents as packed strings, so they survive any
JSON parser bit for bit and keep canonicalization cheap. Decoding is strict: bad base64,
a length that is not a multiple of four, NaN/Inf logprobs and negative token IDs are refused.
"""

from __future__ import annotations

import array
import base64
import binascii
import sys
from collections.abc import Iterable
from typing import Any

import pybase64

from ledger.errors import InvalidInput

_LITTLE = sys.byteorder == "little"

# byte 3 (most significant) of a little-endian int32: sign bit set -> negative
_NEG_TABLE = bytes(1 if b & 0x80 else 0 for b in range(256))
# a float32 is NaN or Inf exactly when its 8 exponent bits are all ones: bits 30..23,
# i.e. (byte3 & 0x7f) == 0x7f and (byte2 & 0x80) == 0x80 in little-endian order.
_EXP_HI_TABLE = bytes(1 if (b & 0x7F) == 0x7F else 0 for b in range(256))
_EXP_LO_TABLE = bytes(1 if b & 0x80 else 0 for b in range(256))


def _to_le(arr: array.array[int] | array.array[float]) -> bytes:
    if not _LITTLE:
        arr = array.array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def pack_int32(values: Iterable[int]) -> str:
    """Pack integers as base64 of little-endian int32."""
    try:
        arr = array.array("i", values)
    except OverflowError as exc:
        raise InvalidInput(f"token ID out of int32 range: {exc}", code="invalid_token_ids") from exc
    return base64.b64encode(_to_le(arr)).decode("ascii")


def pack_float32(values: Iterable[float]) -> str:
    """Pack floats as base64 of little-endian float32 (values are rounded to float32)."""
    return base64.b64encode(_to_le(array.array("f", values))).decode("ascii")


def pack_float32_bytes(raw: bytes) -> str:
    """Pack already-encoded little-endian float32 bytes (bit-exact, no rounding)."""
    if len(raw) % 4:
        raise InvalidInput("float32 buffer length is not a multiple of 4", code="invalid_packing")
    return base64.b64encode(raw).decode("ascii")


def strict_b64decode(text: str) -> bytes:
    """``binascii.a2b_base64(text, strict_mode=True)``, several times faster on the long
    arrays of a record: pybase64's SIMD decoder first, and whatever it refuses is decided by
    ``binascii`` (which also takes a few forms pybase64 refuses, such as a stray ``=`` after a
    whole group, so records logged before keep parsing). pybase64 takes nothing that
    ``binascii``'s strict mode refuses, and decodes to the same bytes
    (tests/ledger/test_packing.py compares them)."""
    try:
        return pybase64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error is one; so is a non-ASCII str
        return binascii.a2b_base64(text.encode("ascii"), strict_mode=True)


def decode_packed(value: object, field: str) -> bytes:
    """Strictly decode a packed array string into its raw little-endian bytes."""
    if not isinstance(value, str):
        raise InvalidInput(f"{field}: expected a base64 string", code="schema_violation")
    try:
        raw = strict_b64decode(value)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise InvalidInput(f"{field}: not valid base64 ({exc})", code="invalid_packing") from exc
    if len(raw) % 4:
        raise InvalidInput(
            f"{field}: {len(raw)} bytes is not a whole number of 4-byte elements",
            code="invalid_packing",
        )
    return raw


def check_token_ids(raw: bytes, field: str) -> int:
    """Check a packed int32 buffer holds no negative IDs; return the element count."""
    if 1 in raw[3::4].translate(_NEG_TABLE):
        first = next(i for i, b in enumerate(raw[3::4]) if b & 0x80)
        raise InvalidInput(
            f"{field}: negative token ID at position {first}",
            code="invalid_token_ids",
            details={"field": field, "position": first},
        )
    return len(raw) // 4


def check_logprobs(raw: bytes, field: str) -> int:
    """Check a packed float32 buffer holds no NaN or infinity; return the element count."""
    hi = raw[3::4].translate(_EXP_HI_TABLE)
    lo = raw[2::4].translate(_EXP_LO_TABLE)
    if int.from_bytes(hi, "little") & int.from_bytes(lo, "little"):
        first = next(i for i, (h, lw) in enumerate(zip(hi, lo, strict=True)) if h and lw)
        raise InvalidInput(
            f"{field}: NaN or infinity at position {first}",
            code="invalid_logprobs",
            details={"field": field, "position": first},
        )
    return len(raw) // 4


def _unpack(value: str, field: str, typecode: str) -> list[Any]:
    arr = array.array(typecode)
    arr.frombytes(decode_packed(value, field))
    if not _LITTLE:
        arr.byteswap()
    return arr.tolist()


def unpack_int32(value: str, field: str = "array") -> list[int]:
    return _unpack(value, field, "i")


def unpack_float32(value: str, field: str = "array") -> list[float]:
    return _unpack(value, field, "f")
