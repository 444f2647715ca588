"""The members of an evidence bundle, and the ``format`` check that parses them (pure).

Every object of a bundle has a fixed set of members; :func:`parse_bundle` refuses a missing
member, a member of the wrong type (``true`` is not an integer), and a member the format does
not define, so that nothing in a bundle that verifies goes unchecked. It decodes every base64
value and parses every envelope; the checks in :mod:`ledger.evidence` then compare them. The
members that bundles of one export share (``keys``, ``fingerprint``) are parsed once for each
distinct value, and that parse reused only for the same JSON (:func:`_reused`).

Format ``v3`` (written since records commit to their content, schema v2) adds
``disclosures`` (the record's disclosures this bundle carries: all, a chosen subset, or none
once erased) and, when the record's content was erased, ``erasure`` (the event, proven).
Format ``v2`` (bundles that carry the record's fingerprint) is read as v3 without them;
``v1`` bundles (no ``fingerprint``, no ``keys.fingerprint_signer``, ``replays`` optional) are
still read, and their verification says the fingerprint was not included.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import orjson

from ledger.errors import LedgerError, VerificationError
from ledger.records import RECORD_KIND
from ledger.signing import KEY_ID_PREFIX, Envelope, VerifyingKey, cached_verifying_key

FORMAT = "inference-ledger/evidence/v3"
FORMAT_V2 = "inference-ledger/evidence/v2"
FORMAT_V1 = "inference-ledger/evidence/v1"
FORMATS = (FORMAT, FORMAT_V2, FORMAT_V1)

# A member's cache key is its JSON as orjson writes it, refusing a subclass of a JSON type
# (names in the member's order: bundles of one export write them alike).
_CACHE_KEY = orjson.OPT_PASSTHROUGH_SUBCLASS
_T = TypeVar("_T")
_Schema = dict[str, type]
# member -> its exact JSON type (an int member is never a boolean)
_TOP: _Schema = {
    "format": str,
    "request_id": str,
    "envelope": dict,
    "leaf_index": int,
    "leaf_hash": str,
    "inclusion_proof": dict,
    "checkpoint": str,
    "fingerprint": dict,
    "keys": dict,
    "replays": list,
    "disclosures": list,
    "erasure": dict,
    "exported_at": str,
}
_TOP_V3_OPTIONAL = ("erasure",)
_TOP_V3_ONLY = ("disclosures", "erasure")
_TOP_V1_OPTIONAL = ("replays",)
_TOP_V1_ABSENT = ("fingerprint",)
_PROOF: _Schema = {"tree_size": int, "hashes": list}
_KEYS: _Schema = {"collector": dict, "fingerprint_signer": dict, "log": dict}
_KEYS_V1: _Schema = {"collector": dict, "log": dict}
_KEY: _Schema = {"key_id": str, "name": str, "role": str, "public_key": str, "registration": dict}
_LOG_KEY: _Schema = {"key_id": str, "public_key": str, "origin": str, "vkey": str}
_LEAF: _Schema = {"envelope": dict, "leaf_index": int, "hashes": list}


def fail(check: str, message: str, code: str = "bad_evidence") -> VerificationError:
    return VerificationError(message, code=code, details={"check": check})


def b64decode(text: str) -> bytes:
    """Strict base64 (``base64.b64decode(text, validate=True)`` without its Python wrapper)."""
    return binascii.a2b_base64(text, strict_mode=True)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        twice = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        shown = ", ".join(repr(k[:80]) for k in twice[:10]) + (", ..." if len(twice) > 10 else "")
        raise fail("format", f"an object of the bundle names a member twice: {shown}")
    return obj


def _no_constant(name: str) -> Any:
    raise fail("format", f"{name} is not JSON")


def load_bundle(data: bytes) -> Any:
    """A bundle file's JSON, refusing what JSON parsers read differently: a member named twice
    (one reader sees the first value, another the last) and NaN or Infinity."""
    # UTF-8, strictly (json.loads of bytes would take an encoded surrogate, and UTF-16), a
    # leading BOM skipped as a browser's TextDecoder skips it
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise fail("format", f"the bytes are not UTF-8 text: {exc}") from exc
    _check_containers(data)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise fail("format", f"not JSON: {exc}") from exc
    except RecursionError:
        raise fail("format", "the bundle's JSON is nested too deeply") from None


# A bundle holds a few hundred JSON objects and arrays (its record's request may add its
# messages); parsed, each costs Python about 30 times its 2-3 bytes of text, so a file of
# nothing but "{}," would take gigabytes before its format is looked at.
MAX_CONTAINERS = 1_000_000
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _check_containers(data: bytes) -> None:
    """Refuse, before parsing, a text with more than :data:`MAX_CONTAINERS` objects and
    arrays (brackets inside strings are not counted; they are only looked for when the bytes
    hold that many brackets at all)."""
    if data.count(b"{") + data.count(b"[") <= MAX_CONTAINERS:
        return
    outside = _STRING.sub(b"", data)
    if outside.count(b"{") + outside.count(b"[") > MAX_CONTAINERS:
        raise fail(
            "format",
            f"the bundle holds more than {MAX_CONTAINERS:,} JSON objects and arrays; a ledger "
            "bundle holds a few hundred",
        )


@dataclass(frozen=True)
class ProvenLeaf:
    """A ``{"envelope", "leaf_index", "hashes"}`` member: an envelope and its inclusion proof."""

    envelope: Envelope
    index: int
    proof: tuple[bytes, ...]


@dataclass(frozen=True)
class KeyEntry:
    """A ``keys.collector`` or ``keys.fingerprint_signer`` member."""

    key: VerifyingKey
    name: str
    role: str
    public_key: str  # as written: "ed25519:<base64 raw>"
    registration: ProvenLeaf


@dataclass(frozen=True)
class LogKeyEntry:
    key: VerifyingKey
    origin: str
    vkey: str


class ParsedBundle(NamedTuple):
    """A bundle's members, decoded. Immutable like the frozen dataclasses above, but one is
    built for every bundle verified, and a tuple builds in a fraction of the time."""

    format: str
    request_id: str
    record: Envelope
    leaf_index: int
    leaf_hash: bytes
    tree_size: int
    proof: tuple[bytes, ...]
    checkpoint: str
    collector: KeyEntry
    log: LogKeyEntry
    fingerprint: ProvenLeaf | None  # None only in v1
    fingerprint_signer: KeyEntry | None  # None only in v1
    replays: tuple[ProvenLeaf, ...]
    disclosures: tuple[object, ...] = ()  # as carried; ``ledger.disclosures`` opens them
    erasure: ProvenLeaf | None = None


def _members(
    obj: Any, schema: _Schema, where: str, optional: tuple[str, ...] = ()
) -> dict[str, Any]:
    # Exact types: JSON parsers give exactly str, int, bool, dict, list, so a boolean is not
    # an int here. The first loop is the whole cost for a well-formed member.
    if type(obj) is dict:
        held = 0
        for name, kind in schema.items():
            kind_held = type(obj.get(name, _ABSENT))
            if kind_held is kind:
                held += 1
            elif kind_held is not _Absent or name not in optional:
                break
        else:
            if held == len(obj):  # no member the schema does not define
                return obj
    if not isinstance(obj, dict):
        raise fail("format", f"{where} must be a JSON object")
    unknown = sorted(set(obj) - set(schema))
    if unknown:
        raise fail("format", f"{where} has members the format does not define: {unknown}")
    for name, kind in schema.items():
        if name not in obj:
            if name in optional:
                continue
            raise fail("format", f"member {where}.{name} is missing")
        if type(obj[name]) is not kind:
            raise fail("format", f"member {where}.{name} must be a JSON {_TYPE_NAMES[kind]}")
    return obj


_TYPE_NAMES = {str: "string", int: "integer", dict: "object", list: "array"}


class _Absent:
    """The type of a member that is not there (no JSON value has it)."""


_ABSENT = _Absent()


def _envelope(data: Any, where: str) -> Envelope:
    try:
        return Envelope.from_dict(data)
    except LedgerError as exc:
        raise fail("format", f"{where}: {exc.message}") from exc


def _hashes(items: list[Any], where: str) -> tuple[bytes, ...]:
    try:  # b64decode, without a call of it per hash
        return tuple([binascii.a2b_base64(h, strict_mode=True) for h in items])
    except (binascii.Error, ValueError, TypeError) as exc:
        raise fail("format", f"{where} holds a value that is not base64: {exc}") from exc


def _leaf(member: Any, where: str) -> ProvenLeaf:
    leaf = _members(member, _LEAF, where)
    return ProvenLeaf(
        _envelope(leaf["envelope"], f"{where}.envelope"),
        leaf["leaf_index"],
        _hashes(leaf["hashes"], f"{where}.hashes"),
    )


def _key(entry: dict[str, Any], where: str) -> VerifyingKey:
    try:
        key = cached_verifying_key(entry["public_key"])
    except LedgerError as exc:
        raise fail("format", f"{where}.public_key is not valid: {exc.message}") from exc
    if key.key_id != entry["key_id"]:
        raise fail("format", f"{where}.key_id is not the ID of {where}.public_key")
    # One spelling, the one the ledger writes: PEM headers, trailing text or another base64
    # layout would be unchecked text in a bundle that verifies (and parsers differ on them).
    if entry["public_key"] != KEY_ID_PREFIX + base64.b64encode(key.raw).decode("ascii"):
        raise fail("format", f"{where}.public_key is not written as ed25519:<base64 of the key>")
    return key


def _key_entry(member: Any, where: str) -> KeyEntry:
    entry = _members(member, _KEY, where)
    return KeyEntry(
        key=_key(entry, where),
        name=entry["name"],
        role=entry["role"],
        public_key=entry["public_key"],
        registration=_leaf(entry["registration"], f"{where}.registration"),
    )


def _log_key_entry(member: Any, where: str) -> LogKeyEntry:
    entry = _members(member, _LOG_KEY, where)
    return LogKeyEntry(_key(entry, where), entry["origin"], entry["vkey"])


_Keys = tuple[KeyEntry, KeyEntry | None, LogKeyEntry]  # collector, fingerprint signer, log


def _keys(member: Any, where: str) -> _Keys:
    """The ``keys`` member of a v2 bundle."""
    keys = _members(member, _KEYS, where)
    return (
        _key_entry(keys["collector"], f"{where}.collector"),
        _key_entry(keys["fingerprint_signer"], f"{where}.fingerprint_signer"),
        _log_key_entry(keys["log"], f"{where}.log"),
    )


def _keys_v1(member: Any, where: str) -> _Keys:
    """The ``keys`` member of a v1 bundle (no fingerprint signer)."""
    keys = _members(member, _KEYS_V1, where)
    return (
        _key_entry(keys["collector"], f"{where}.collector"),
        None,
        _log_key_entry(keys["log"], f"{where}.log"),
    )


def _reused(parse: Callable[[Any, str], _T], member: Any, where: str) -> _T:
    """``parse(member, where)``, reused from an earlier bundle that held the same member.

    Bundles of one export share their keys and their fingerprint, so each distinct member is
    parsed once (every check of ``parse`` included), keyed by its JSON bytes. A result is
    reused only for a member that also equals the document it was parsed from: orjson writes
    NaN and the infinities as ``null`` and a tuple as an array, which equality tells apart
    (bytes alone tell ``true`` from ``1`` and ``1.0``). What orjson refuses to write (a
    subclass of a JSON type, an integer beyond 64 bits) is parsed afresh. Failures raise and
    are never cached.
    """
    try:
        document = orjson.dumps(member, option=_CACHE_KEY)
    except orjson.JSONEncodeError:
        return parse(member, where)
    if len(document) > _CACHED_MEMBER:  # no honest member is this large: not kept
        return parse(member, where)
    parsed_from, parsed = _parsed(parse, document, where)
    return parsed if parsed_from == member else parse(member, where)


# What the cache may hold: members are parsed (not verified) before they are kept, so a
# stream of hostile bundles fills it with at most 64 entries of 64 KiB each (a fingerprint
# and three key entries take a few KiB).
_CACHED_MEMBER = 64 * 1024


@functools.lru_cache(maxsize=64)
def _parsed(parse: Callable[[Any, str], Any], document: bytes, where: str) -> tuple[Any, Any]:
    member = orjson.loads(document)
    return member, parse(member, where)


def parse_bundle(bundle: Any) -> ParsedBundle:
    """The ``format`` check: every member present, of its type, decoded; nothing else."""
    if not isinstance(bundle, dict) or not isinstance(bundle.get("format"), str):
        raise fail("format", "not an evidence bundle: member 'format' is missing")
    version = bundle["format"]
    if version not in FORMATS:
        raise fail("format", f"unknown bundle format {version!r}; reads {', '.join(FORMATS)}")
    v1 = version == FORMAT_V1
    if v1 and any(name in bundle for name in _TOP_V1_ABSENT):
        raise fail("format", f"a {FORMAT_V1} bundle has no member 'fingerprint'")
    v3 = version == FORMAT
    if not v3 and any(name in bundle for name in _TOP_V3_ONLY):
        raise fail("format", f"a {version} bundle has no member 'disclosures' or 'erasure'")
    absent: tuple[str, ...]
    if v1:
        absent = _TOP_V1_OPTIONAL + _TOP_V1_ABSENT + _TOP_V3_ONLY
    else:
        absent = _TOP_V3_OPTIONAL if v3 else _TOP_V3_ONLY
    top = _members(bundle, _TOP, "bundle", absent)
    proof = _members(top["inclusion_proof"], _PROOF, "inclusion_proof")
    collector, signer, log = _reused(_keys_v1 if v1 else _keys, top["keys"], "keys")
    record = _envelope(top["envelope"], "envelope")
    if record.kind != RECORD_KIND:
        raise fail("format", f"the envelope is a {record.kind!r}, not an {RECORD_KIND!r}")
    if not v3 and record.body.get("schema_version") != 1:
        # older formats cannot carry a v2 record's content or its erasure: relabelled, a v3
        # bundle would verify with its content and fingerprint checks left out
        raise fail("format", f"a {version} bundle carries schema version 1 records only")
    try:
        leaf_hash = b64decode(top["leaf_hash"])
    except (binascii.Error, ValueError) as exc:
        raise fail("format", f"leaf_hash is not base64: {exc}") from exc
    replays = top.get("replays", [])
    return ParsedBundle(
        format=version,
        request_id=top["request_id"],
        record=record,
        leaf_index=top["leaf_index"],
        leaf_hash=leaf_hash,
        tree_size=proof["tree_size"],
        proof=_hashes(proof["hashes"], "inclusion_proof.hashes"),
        checkpoint=top["checkpoint"],
        collector=collector,
        log=log,
        fingerprint=None if v1 else _reused(_leaf, top["fingerprint"], "fingerprint"),
        fingerprint_signer=signer,
        # a record's own verdicts: no other bundle holds them, so nothing to reuse
        replays=tuple(_leaf(item, f"replays[{i}]") for i, item in enumerate(replays)),
        disclosures=tuple(top.get("disclosures", ())),
        erasure=_leaf(top["erasure"], "erasure") if "erasure" in top else None,
    )
