"""Canonical JSON (RFC 8785, JCS): the one function that produces signed and hashed bytes.

Nothing else in the project serializes JSON for a signature or a digest.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

from ledger.errors import InvalidInput


def canonicalize(value: Any) -> bytes:
    """Return the RFC 8785 canonical UTF-8 bytes of a JSON value.

    Raises InvalidInput for values JSON cannot carry exactly (NaN, infinities, integers
    beyond the IEEE-754 safe range, lone surrogates, non-string keys).
    """
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, UnicodeError) as exc:
        raise InvalidInput(
            f"value cannot be canonicalized (RFC 8785): {exc}", code="not_canonicalizable"
        ) from exc


def sha256_digest(data: bytes) -> str:
    """Return an algorithm-labelled SHA-256 digest: ``sha256:<64 hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digest_of(value: Any) -> str:
    """``sha256:`` digest of the canonical form of a JSON value."""
    return sha256_digest(canonicalize(value))
