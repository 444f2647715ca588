"""Canonical JSON (RFC 8785, JCS): the one function that produces signed and hashed bytes.

Nothing else in the project serializes JSON for a signature or a digest. Two documents are
assembled from canonical parts where RFC 8785's member order makes that exact: an envelope
around its canonical body (``ledger.signing``) and a cache-key document around its prompt
(``ledger.cachekey``).

Two paths give the same bytes, tested byte for byte against ``rfc8785.dumps``
(tests/ledger/test_canonical.py):

- The common documents (ASCII member names, integers in the safe range, floats that are
  integral below 2**53 or non-integral with 1e-4 <= |x|) go to ``orjson`` with sorted keys,
  after one walk that checks those conditions and writes integral floats as integers. For those
  values orjson's output is RFC 8785's: code-point order equals UTF-16 order for ASCII names,
  its string escapes are RFC 8785's minimal ones, and its shortest round-trip floats in that
  range are ECMAScript's digits. A 512 + 256 token record with top-5 logprobs: about 0.02 ms.
- Anything else (a tiny or huge float, a non-ASCII member name, a type orjson would write
  differently) takes the general walk: strings and integer arrays by the C JSON encoder,
  member names ordered by UTF-16 code units, floats as ECMAScript writes them (the
  ``rfc8785`` package for exponents). It decides every refusal.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from typing import Any

import orjson
import rfc8785

from ledger.errors import InvalidInput

_MAX_SAFE = 2**53 - 1
_INT_ONLY = {int}
# printable ASCII except '"' and '\\': the characters JCS never escapes
_PLAIN_ASCII = bytes(c for c in range(0x20, 0x7F) if c not in (0x22, 0x5C))
_encode_str = json.encoder.encode_basestring
_encode_ints = json.JSONEncoder(separators=(",", ":")).encode
_FLOAT_FAST_MAX = float(2**53)
_FLOAT_INTEGER_DIGITS_MAX = 1e21  # from here ECMAScript writes an exponent


def canonicalize(value: Any) -> bytes:
    """Return the RFC 8785 canonical UTF-8 bytes of a JSON value.

    Raises InvalidInput for values JSON cannot carry exactly (NaN, infinities, integers
    beyond the IEEE-754 safe range, whether ints or integral floats that RFC 8785 writes as
    integer digits, lone surrogates, non-string member names).
    """
    if type(value) is str:  # envelope members: orjson's escapes are RFC 8785's
        try:
            return orjson.dumps(value)
        except orjson.JSONEncodeError:  # a lone surrogate: refused below
            pass
    try:
        prepared = _prepared(value)
    except (TypeError, RecursionError):  # a non-string member name, deep nesting: general walk
        prepared = _GENERAL
    if prepared is not _GENERAL:
        try:
            return orjson.dumps(prepared, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # lone surrogates, orjson's depth limit: general walk
            pass
    out: list[str] = []
    try:
        _emit(value, out)
        return "".join(out).encode("utf-8")
    except (rfc8785.CanonicalizationError, TypeError, ValueError, UnicodeError) as exc:
        raise InvalidInput(
            f"value cannot be canonicalized (RFC 8785): {exc}", code="not_canonicalizable"
        ) from exc
    except RecursionError as exc:
        raise InvalidInput("value is nested too deeply", code="not_canonicalizable") from exc


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _quote(text: str) -> str:
    """Quote a string as RFC 8785 does (minimal escapes)."""
    if len(text) <= 64:
        plain = text.isascii() and text.isprintable() and '"' not in text and "\\" not in text
    else:  # long strings (packed arrays): one C pass over the bytes
        raw = text.encode("ascii", "ignore")
        plain = len(raw) == len(text) and not raw.translate(None, _PLAIN_ASCII)
    if plain:  # printable ASCII without '"' or '\\' needs no escapes at all
        return '"' + text + '"'
    quoted: str = _encode_str(text)
    return quoted


def _float(value: float) -> str:
    """ECMAScript's Number serialization (RFC 8785 section 3.2.2.3).

    Two common shapes take a fast path that gives the same characters: an integral value
    below 2**53 is its integer digits, and 1e-4 <= |value| < 2**53 is Python's shortest
    round-trip repr, which is positional there with the digits ECMAScript chooses. Everything
    else (exponents, NaN and infinity refusals) is the ``rfc8785`` package's.
    """
    size = abs(value)
    if size < _FLOAT_FAST_MAX:
        if value.is_integer():
            return str(int(value))  # also -0.0 -> "0"
        if size >= 1e-4:
            return repr(value)
    elif written_as_unsafe_integer(value):
        raise ValueError(f"number {value!r} is an integer outside the IEEE-754 safe range")
    return rfc8785.dumps(value).decode("ascii")


def written_as_unsafe_integer(value: float) -> bool:
    """Whether RFC 8785 writes the float ``value`` as integer digits beyond 2**53 - 1
    (2**53 <= |value| < 1e21). Those digits read back as an integer beyond the safe range, so
    :func:`canonicalize` refuses such a float as it refuses that integer: canonical bytes
    always parse to a value that canonicalizes to them again."""
    return _FLOAT_FAST_MAX <= abs(value) < _FLOAT_INTEGER_DIGITS_MAX


def figure(value: float | None) -> float | None:
    """A computed figure as a signed document holds it: None for what has no canonical form
    (an infinity, NaN, or a float written as an integer beyond 2**53: a logprob delta between
    float32 values near -1e17 is one)."""
    if value is None or not math.isfinite(value) or written_as_unsafe_integer(value):
        return None
    return value


_GENERAL: Any = object()  # "this value needs the general walk"
_SCALARS = {str, bool, type(None)}


def _prepared(value: Any) -> Any:
    """The value as orjson will write it canonically, or ``_GENERAL``.

    Returns ``value`` itself when nothing changes, or a copy of the containers on the way to an
    integral float, which becomes an int (RFC 8785 writes 2.0 as 2, orjson as 2.0).
    """
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is int:
        return value if -_MAX_SAFE <= value <= _MAX_SAFE else _GENERAL
    if kind is float:
        size = abs(value)
        if value.is_integer():
            return int(value) if size < _FLOAT_FAST_MAX else _GENERAL
        return value if 1e-4 <= size < _FLOAT_FAST_MAX else _GENERAL  # also refuses NaN, inf
    if kind is dict:
        if not "".join(value).isascii():  # TypeError for a non-string name
            return _GENERAL
        members: Iterable[tuple[Any, Any]] = value.items()
    elif kind is list or kind is tuple:
        if value and type(value[0]) is int and set(map(type, value)) == _INT_ONLY:
            return value if min(value) >= -_MAX_SAFE and max(value) <= _MAX_SAFE else _GENERAL
        members = enumerate(value)
    else:
        return _GENERAL
    copy = None
    for key, item in members:
        member_kind = type(item)
        if member_kind in _SCALARS:  # most members: skip the call
            continue
        if member_kind is int:  # and integers, the next most
            if -_MAX_SAFE <= item <= _MAX_SAFE:
                continue
            return _GENERAL
        ready = _prepared(item)
        if ready is not item:
            if ready is _GENERAL:
                return _GENERAL
            if copy is None:
                copy = dict(value) if kind is dict else list(value)
            copy[key] = ready
    return value if copy is None else copy


def _emit(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(_quote(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        if not -_MAX_SAFE <= value <= _MAX_SAFE:
            raise ValueError(f"integer {value} is outside the IEEE-754 safe range")
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"member name {key!r} is not a string")
        out.append("{")
        # Code-point order equals UTF-16 order unless a name holds a non-BMP character.
        names = sorted(value) if "".join(value).isascii() else sorted(value, key=_utf16)
        for i, key in enumerate(names):
            if i:
                out.append(",")
            out.append(_quote(key))
            out.append(":")
            _emit(value[key], out)
        out.append("}")
    elif isinstance(value, list | tuple):
        if value and type(value[0]) is int and set(map(type, value)) == _INT_ONLY:
            if not -_MAX_SAFE <= min(value) <= max(value) <= _MAX_SAFE:
                raise ValueError("an integer is outside the IEEE-754 safe range")
            out.append(_encode_ints(value))  # C encoder: "[1,2,3]", as RFC 8785 writes it
            return
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _emit(item, out)
        out.append("]")
    else:
        raise TypeError(f"{type(value).__name__} is not a JSON value")


def sha256_digest(data: bytes) -> str:
    """Return an algorithm-labelled SHA-256 digest: ``sha256:<64 hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digest_of(value: Any) -> str:
    """``sha256:`` digest of the canonical form of a JSON value."""
    return sha256_digest(canonicalize(value))
