"""Salted disclosures: how a signed body commits to content it does not hold (IETF SD-JWT style).

A **disclosure** is the base64url (no padding) encoding of the RFC 8785 canonical JSON array
``[salt, member, value]``: ``salt`` is base64url of at least 16 fresh random bytes, ``member``
names what the value is (``request``, ``choices[0].token_ids``, ...). Its **digest** is
``sha256:`` + hex SHA-256 of the disclosure's ASCII characters. A signed body carries the
sorted digests of its disclosures and none of their values; the disclosures travel and are
stored apart, and deleting one leaves its digest, which reveals nothing: the salt is random per
disclosure, so trying candidate values against a digest confirms none without the salt, and the
digests are sorted, so their order does not say which member each one commits to.

Opening (:func:`open_disclosures`) checks, in this order, and raises ``VerificationError`` with
``details["check"]`` naming the step:

1. ``encoding``: the disclosure is base64url without padding, of a canonical JSON array of
   three members, a salt of at least 16 bytes and a member name this module knows;
2. ``digest``: its digest is one of the body's digests;
3. ``unique``: no digest is opened twice and no member is disclosed twice.

Ingest adds a fourth (:func:`check_salts`; a verifier does not repeat it, so what was logged
before it keeps verifying):

4. ``salt``: no salt is longer than 64 bytes or repeats a pattern shorter than 16 bytes
   (``"A" * 22``, ``"0" * 22``, ``salt`` four times: fewer than 128 random bits), and no two
   disclosures of the record have salts that hold the same 16 bytes (:func:`salt_keys`: one
   salt for every member lets whoever holds one disclosure confirm guesses of the others
   from their digests). The ledger also refuses a salt it accepted before, from another
   record (``ledger.storage.ingest``).

Nothing here knows a record's schema: ``ledger.record_v2`` says which members a record
commits, and :func:`commit` makes the disclosures for them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import orjson
import pybase64

from ledger.canonical import canonicalize
from ledger.errors import InvalidInput, VerificationError

SALT_BYTES = 16
# Ingest refuses longer salts (each of its 16-byte windows is kept: ``salt_keys``).
MAX_SALT_BYTES = 64
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
MEMBER = re.compile(
    r"^(request|request_raw|prompt_token_ids|replay_output"
    r"|choices\[(0|[1-9][0-9]{0,4})\]\.(token_ids|text|logprobs|top_logprobs|margins))$"
)
# base64url text that decodes to at least SALT_BYTES bytes, given a length that is not 1
# modulo 4 (every such text decodes, non-canonical trailing bits and all): 22 characters hold
# 16 bytes. Other salts are decoded to be told apart (not base64url, or too short).
_SALT_CHARS = -(-SALT_BYTES * 4 // 3)
_SALT = re.compile(rf"[A-Za-z0-9_-]{{{_SALT_CHARS},}}")
# A disclosure is refused past this many characters (a record's largest member, request_raw,
# is bounded by the ledger's body limit long before).
MAX_DISCLOSURE = 64 * 1024 * 1024


def _fail(check: str, message: str, **details: Any) -> VerificationError:
    return VerificationError(
        message, code="invalid_disclosure", details={"check": check, **details}
    )


class Disclosure(NamedTuple):
    """One opened disclosure (immutable). Build it with :meth:`of`, which derives ``digest``
    from ``encoded``: a named tuple, because every bundle verified opens several and a frozen
    dataclass's constructor costs several times a tuple's."""

    encoded: str
    salt: str
    member: str
    value: Any
    digest: str

    @classmethod
    def of(cls, encoded: str, salt: str, member: str, value: Any) -> Disclosure:
        return cls(encoded, salt, member, value, digest_of(encoded))


def digest_of(encoded: str) -> str:
    """The ``sha256:`` digest of a disclosure's characters."""
    return "sha256:" + hashlib.sha256(encoded.encode("ascii")).hexdigest()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    """Strict base64url without padding: the standard alphabet's ``+``, ``/`` and ``=`` are
    refused, then the decoder's validation refuses every other stray character. pybase64
    (SIMD) decodes the url-safe alphabet directly, several times faster than a translation to
    the standard one and ``binascii``: disclosures are most of a bundle's bytes. It takes and
    refuses exactly what ``binascii.a2b_base64(..., strict_mode=True)`` of the translated text
    does (tests/ledger/test_disclosures.py compares them)."""
    if "+" in text or "/" in text or "=" in text or len(text) % 4 == 1:
        raise ValueError("not base64url without padding")
    return pybase64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def make(member: str, value: Any, salt: str | None = None) -> Disclosure:
    """A disclosure of ``value`` as ``member``, under a fresh random salt unless one is given
    (tests give one to build fixed vectors)."""
    if not MEMBER.fullmatch(member):
        raise ValueError(f"unknown disclosure member {member!r}")
    salt = salt if salt is not None else _b64url(secrets.token_bytes(SALT_BYTES))
    encoded = _b64url(canonicalize([salt, member, value]))
    return Disclosure.of(encoded, salt, member, value)


def commit(members: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Disclosures of ``members`` (name -> value) and their digests, sorted. Each salt is its
    own 16 bytes of one draw from the system's CSPRNG (one draw per record, not per member)."""
    random = secrets.token_bytes(SALT_BYTES * len(members))
    made = [
        make(member, value, _b64url(random[i * SALT_BYTES : (i + 1) * SALT_BYTES]))
        for i, (member, value) in enumerate(members.items())
    ]
    return sorted(d.digest for d in made), [d.encoded for d in made]


def parse(encoded: object) -> Disclosure:
    """Decode one disclosure (check ``encoding``); VerificationError when it is malformed."""
    if not isinstance(encoded, str) or not encoded or len(encoded) > MAX_DISCLOSURE:
        raise _fail("encoding", "a disclosure must be a non-empty base64url string")
    # The canonical re-encoding must give back the very bytes: so a member named twice (a
    # parser keeps one of them), NaN, a float where an integer was, or any other spelling of
    # the same value is refused, and every reader sees the one value the digest commits to.
    try:
        raw = _unb64url(encoded)
        value = orjson.loads(raw)
        if canonicalize(value) != raw:
            raise ValueError("not RFC 8785 canonical JSON")
    except (ValueError, binascii.Error, RecursionError, orjson.JSONDecodeError) as exc:
        raise _fail("encoding", f"a disclosure does not decode: {exc}") from None
    except InvalidInput as exc:  # no canonical form (a lone surrogate, a huge integer)
        raise _fail("encoding", f"a disclosure does not decode: {exc.message}") from None
    if not isinstance(value, list) or len(value) != 3:
        raise _fail("encoding", "a disclosure must be the array [salt, member, value]")
    salt, member, inner = value
    if not isinstance(salt, str) or not isinstance(member, str):
        raise _fail("encoding", "a disclosure's salt and member must be strings")
    if not (_SALT.fullmatch(salt) and len(salt) % 4 != 1):  # the common case, decided at once
        try:
            salt_bytes = _unb64url(salt)
        except (ValueError, binascii.Error):
            raise _fail("encoding", "a disclosure's salt must be base64url") from None
        if len(salt_bytes) < SALT_BYTES:
            raise _fail("encoding", f"a disclosure's salt must hold at least {SALT_BYTES} bytes")
    if not MEMBER.fullmatch(member):
        raise _fail("encoding", f"unknown disclosure member {member[:80]!r}")
    return Disclosure.of(encoded, salt, member, inner)


def salt_keys(salt: str) -> tuple[bytes, ...]:
    """The SHA-256 of every SALT_BYTES-byte window of a (parsed) salt, without repeats: one
    for a salt of SALT_BYTES bytes. Two salts share a key when one holds, at any offset, 16
    bytes the other holds: one salt reused (other trailing bits of a 22-character salt, bytes
    added before or after it, a random stream read again at another offset). What the ledger
    keeps of every salt it accepted, erased or not (``salts``: a random salt's hash confirms
    no guess of the content it salted)."""
    return _salt_keys(_unb64url(salt))


def _salt_keys(raw: bytes) -> tuple[bytes, ...]:
    windows = range(len(raw) - SALT_BYTES + 1)
    return tuple(dict.fromkeys(hashlib.sha256(raw[i : i + SALT_BYTES]).digest() for i in windows))


def salt_of(head: str) -> str | None:
    """The salt of a disclosure (one a ledger accepted) from its first characters, or None
    when they do not hold all of it."""
    head = head[: len(head) // 4 * 4]
    try:
        text = _unb64url(head)
    except (ValueError, binascii.Error):
        return None
    end = text.find(b'"', 2)
    return text[2:end].decode("ascii") if text.startswith(b'["') and end > 0 else None


def _repeats(raw: bytes) -> bool:
    """Whether ``raw`` is a pattern of fewer than SALT_BYTES bytes repeated (at least twice,
    the last copy possibly cut short): then it holds fewer than 128 random bits, whatever its
    length. A random 16-byte salt is one with probability below 2**-63."""
    return any(raw[p:] == raw[:-p] for p in range(1, min(len(raw) // 2, SALT_BYTES - 1) + 1))


def check_salts(opened: Iterable[Disclosure]) -> tuple[tuple[bytes, ...], ...]:
    """Check ``salt`` (ingest): every disclosure's salt is fresh. Refuses (VerificationError
    ``invalid_disclosure``, ``details.disclosure`` the position in ``opened``) a salt longer
    than MAX_SALT_BYTES, one that repeats a short pattern, and two salts that share one of
    their :func:`salt_keys`. Only the salts are read: exact, and a few microseconds a record.
    Returns each disclosure's :func:`salt_keys`, in order (what ingest compares with the
    salts of other records)."""
    seen: dict[bytes, int] = {}
    keys: list[tuple[bytes, ...]] = []
    for i, d in enumerate(opened):
        raw = _unb64url(d.salt)
        if len(raw) > MAX_SALT_BYTES:
            raise _fail(
                "salt",
                f"disclosure {i} ({d.member}): its salt holds {len(raw)} bytes; a salt is "
                f"{SALT_BYTES} to {MAX_SALT_BYTES} fresh random bytes",
                disclosure=i,
                member=d.member,
            )
        if _repeats(raw):
            raise _fail(
                "salt",
                f"disclosure {i} ({d.member}): its salt repeats a pattern of fewer than "
                f"{SALT_BYTES} bytes; each salt must be {SALT_BYTES} fresh random bytes",
                disclosure=i,
                member=d.member,
            )
        keys.append(_salt_keys(raw))
        for key in keys[-1]:
            first = seen.setdefault(key, i)
            if first != i:
                raise _fail(
                    "salt",
                    f"disclosure {i} ({d.member}) reuses the salt of disclosure {first}: each "
                    "disclosure's salt must be fresh (one salt disclosed would confirm "
                    "guesses of the other members)",
                    disclosure=i,
                    member=d.member,
                    reuses=first,
                )
    return tuple(keys)


def check_digests(digests: object, where: str = "disclosure_digests") -> tuple[str, ...]:
    """A body's digest list: sorted, unique ``sha256:`` digests (InvalidInput otherwise)."""
    if not isinstance(digests, list) or not all(
        isinstance(d, str) and DIGEST.fullmatch(d) for d in digests
    ):
        raise InvalidInput(
            f"{where} must be a list of sha256:<64 hex> digests", code="schema_violation"
        )
    if any(a >= b for a, b in itertools.pairwise(digests)):
        raise InvalidInput(f"{where} must be sorted and unique", code="schema_violation")
    return tuple(digests)


def open_disclosures(digests: Iterable[str], encoded: Sequence[object]) -> dict[str, Disclosure]:
    """Open ``encoded`` against ``digests``: member name -> disclosure. Raises
    VerificationError (checks ``encoding``, ``digest``, ``unique``) for any disclosure that
    does not open exactly one unopened digest. Digests left unopened are not an error here."""
    wanted = set(digests)
    opened: dict[str, Disclosure] = {}
    used: set[str] = set()
    for i, item in enumerate(encoded):
        try:
            d = parse(item)
        except VerificationError as exc:
            raise exc.with_details(disclosure=i) from None
        digest = d.digest
        if digest not in wanted:
            raise _fail(
                "digest",
                f"disclosure {i} ({d.member}) opens none of the body's digests",
                disclosure=i,
                member=d.member,
            )
        if digest in used or d.member in opened:
            raise _fail("unique", f"disclosure {i} ({d.member}) is disclosed twice", disclosure=i)
        used.add(digest)
        opened[d.member] = d
    return opened
