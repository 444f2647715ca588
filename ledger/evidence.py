"""Evidence bundles (pure): one JSON document that proves a record offline.

Format ``inference-ledger/evidence/v1``::

    {
      "format": "inference-ledger/evidence/v1",
      "request_id": "req-…",
      "envelope": {"kind": "inference_record", "body": {…}, "signature": {…}},
      "leaf_index": 41,
      "leaf_hash": "<base64 SHA-256(0x00 || JCS(envelope))>",
      "inclusion_proof": {"tree_size": 97, "hashes": ["<base64>", …]},
      "checkpoint": "<C2SP signed note covering tree_size>",
      "keys": {
        "collector": {"key_id": "ed25519:…", "name": "…", "role": "collector",
                      "public_key": "ed25519:<base64 raw>",
                      "registration": {"envelope": {<key_registration, signed by the log key>},
                                       "leaf_index": 1, "hashes": ["<base64>", …]}},
        "log": {"key_id": "ed25519:…", "public_key": "ed25519:<base64 raw>",
                "origin": "…", "vkey": "<C2SP verifier key>"}
      },
      "replays": [{"envelope": {<replay_verdict, signed by the log key>},
                   "leaf_index": 57, "hashes": ["<base64>", …]}],
      "exported_at": "2026-11-29T10:00:00+00:00"
    }

``replays`` (optional; absent in bundles from before replays existed) holds the record's
replay verdicts logged under the same checkpoint, each with its inclusion proof.

:func:`verify_bundle` runs the checks in order and raises :class:`VerificationError` whose
``details["check"]`` names the first that failed: ``format``, ``jcs``, ``collector_signature``,
``log_key_pin``, ``checkpoint_signature``, ``inclusion_proof``, ``collector_key``,
``replays``. ``collector_key`` proves that the collector key was registered in the same log,
by the log key, before the record: a row slipped into the database with a key the log never
registered fails it. A revocation after the record cannot be proven absent offline; ``ledger
audit`` checks it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from dataclasses import dataclass
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger import merkle
from ledger.canonical import canonicalize
from ledger.checkpoint import Checkpoint, verify_checkpoint
from ledger.errors import LedgerError, VerificationError
from ledger.signing import (
    SIGNABLE_KINDS,
    Envelope,
    VerifyingKey,
    cached_verifying_key,
    public_key_raw,
    verify_envelope,
)

FORMAT = "inference-ledger/evidence/v1"
_SORTED = orjson.OPT_SORT_KEYS
CHECKS = (
    "format",
    "jcs",
    "collector_signature",
    "log_key_pin",
    "checkpoint_signature",
    "inclusion_proof",
    "collector_key",
    "replays",
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: str) -> bytes:
    """Strict base64 (``base64.b64decode(text, validate=True)`` without its Python wrapper)."""
    return binascii.a2b_base64(text, strict_mode=True)


def build_bundle(
    *,
    envelope: dict[str, Any],
    leaf_index: int,
    tree_size: int,
    proof: list[bytes],
    checkpoint_note: str,
    collector_key: dict[str, Any],
    registration: dict[str, Any],
    registration_index: int,
    registration_proof: list[bytes],
    log_key: dict[str, Any],
    exported_at: str,
    replays: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    request_id = envelope.get("body", {}).get("request_id")
    bundle = {
        "format": FORMAT,
        "request_id": request_id,
        "envelope": envelope,
        "leaf_index": leaf_index,
        "leaf_hash": b64(merkle.leaf_hash(canonicalize(envelope))),
        "inclusion_proof": {"tree_size": tree_size, "hashes": [b64(h) for h in proof]},
        "checkpoint": checkpoint_note,
        "keys": {
            "collector": {
                **collector_key,
                "registration": {
                    "envelope": registration,
                    "leaf_index": registration_index,
                    "hashes": [b64(h) for h in registration_proof],
                },
            },
            "log": log_key,
        },
        "exported_at": exported_at,
    }
    if replays:
        bundle["replays"] = replays
    return bundle


@dataclass(frozen=True)
class VerifiedBundle:
    request_id: str | None
    kind: str
    leaf_index: int
    tree_size: int
    root_hash: bytes
    collector_key_id: str
    log_key_id: str
    origin: str
    log_key_pinned: bool
    replay_verdicts: tuple[str, ...] = ()


def _fail(check: str, message: str, code: str = "bad_evidence") -> VerificationError:
    return VerificationError(message, code=code, details={"check": check})


def _get(obj: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(obj, dict) or not isinstance(obj.get(key), kind):
        raise _fail("format", f"member {key!r} is missing or has the wrong type")
    return obj[key]


def _key(entry: Any, what: str) -> VerifyingKey:
    try:
        key = cached_verifying_key(_get(entry, "public_key", str))
    except LedgerError as exc:
        raise _fail("format", f"{what} public key is not valid: {exc.message}") from exc
    if key.key_id != _get(entry, "key_id", str):
        raise _fail("format", f"{what} key_id does not match its public key")
    return key


def verify_bundle(bundle: Any, pinned_log_key: Ed25519PublicKey | None = None) -> VerifiedBundle:
    """Verify a bundle fully offline; raises VerificationError naming the failed check."""
    if _get(bundle, "format", str) != FORMAT:
        raise _fail("format", f"unknown bundle format {bundle.get('format')!r}; reads {FORMAT}")
    env_data = _get(bundle, "envelope", dict)
    index = _get(bundle, "leaf_index", int)
    proof_data = _get(bundle, "inclusion_proof", dict)
    tree_size = _get(proof_data, "tree_size", int)
    hashes = _get(proof_data, "hashes", list)
    note = _get(bundle, "checkpoint", str)
    keys = _get(bundle, "keys", dict)
    collector_pub = _key(_get(keys, "collector", dict), "collector")
    log_entry = _get(keys, "log", dict)
    log_pub = _key(log_entry, "log")
    try:
        proof = [_b64decode(h) for h in hashes]
        claimed_leaf = _b64decode(_get(bundle, "leaf_hash", str))
        envelope = Envelope.from_dict(env_data)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise _fail("format", f"bad base64 in proof or leaf hash: {exc}") from exc
    except LedgerError as exc:
        raise _fail("format", exc.message) from exc

    leaf = merkle.leaf_hash(envelope.canonical)
    if leaf != claimed_leaf:
        raise _fail("jcs", "the envelope's canonical bytes do not hash to the logged leaf")

    try:
        verify_envelope(envelope, collector_pub)
    except VerificationError as exc:
        raise _fail("collector_signature", exc.message, exc.code) from exc

    log_key_raw = log_pub.raw if pinned_log_key is None else public_key_raw(pinned_log_key)
    if log_key_raw != log_pub.raw:
        raise _fail(
            "log_key_pin",
            "the checkpoint is signed by a key other than the pinned log key",
            "log_key_mismatch",
        )
    try:
        cp = _verified_checkpoint(note, log_key_raw)
    except VerificationError as exc:
        raise _fail("checkpoint_signature", exc.message, exc.code) from exc

    if cp.tree_size != tree_size:
        raise _fail(
            "inclusion_proof",
            f"proof is for tree size {tree_size}, the checkpoint for {cp.tree_size}",
            "bad_inclusion_proof",
        )
    try:
        merkle.verify_inclusion(leaf, index, tree_size, proof, cp.root_hash)
    except VerificationError as exc:
        raise _fail("inclusion_proof", exc.message, exc.code) from exc
    _verify_registration(keys["collector"], envelope, index, tree_size, cp.root_hash, log_pub)
    replays = _verify_replays(
        bundle.get("replays"), envelope, index, tree_size, cp.root_hash, log_pub
    )
    return VerifiedBundle(
        request_id=envelope.body.get("request_id"),
        kind=envelope.kind,
        leaf_index=index,
        tree_size=tree_size,
        root_hash=cp.root_hash,
        collector_key_id=envelope.key_id,
        log_key_id=log_pub.key_id,
        origin=cp.origin,
        log_key_pinned=pinned_log_key is not None,
        replay_verdicts=replays,
    )


def _verify_replays(
    items: Any,
    record: Envelope,
    record_index: int,
    tree_size: int,
    root_hash: bytes,
    log_pub: VerifyingKey,
) -> tuple[str, ...]:
    """Each replay verdict: signed by the log key, about this record, in the same tree."""
    if items is None:
        return ()
    if not isinstance(items, list):
        raise _fail("replays", "replays must be a list")
    verdicts = []
    for i, item in enumerate(items):
        try:
            env = Envelope.from_dict(item.get("envelope"))
            idx = item["leaf_index"]
            hashes = [_b64decode(h) for h in item["hashes"]]
            if not isinstance(idx, int):
                raise TypeError("leaf_index")
        except (
            AttributeError,
            KeyError,
            TypeError,
            ValueError,
            binascii.Error,
            LedgerError,
        ) as exc:
            raise _fail("replays", f"replays[{i}] is malformed: {exc}") from exc
        body = env.body
        if env.kind != "replay_verdict" or body.get("request_id") != record.body.get("request_id"):
            raise _fail("replays", f"replays[{i}] is not a verdict about this record")
        if (body.get("record") or {}).get("content_hash") != record.body_digest:
            raise _fail("replays", f"replays[{i}] compares another version of the record")
        if idx <= record_index:
            raise _fail("replays", f"replays[{i}] is logged before the record")
        try:
            verify_envelope(env, log_pub)
            merkle.verify_inclusion(
                merkle.leaf_hash(env.canonical), idx, tree_size, hashes, root_hash
            )
        except VerificationError as exc:
            raise _fail("replays", f"replays[{i}]: {exc.message}", exc.code) from exc
        verdicts.append(str(body.get("verdict")))
    return tuple(verdicts)


def _verify_registration(
    entry: dict[str, Any],
    record: Envelope,
    record_index: int,
    tree_size: int,
    root_hash: bytes,
    log_pub: VerifyingKey,
) -> None:
    """The collector key's registration is a leaf of the same tree, before the record."""
    reg = entry.get("registration")
    if not isinstance(reg, dict):
        raise _fail("collector_key", "the bundle carries no registration of the collector key")
    try:
        env, reg_index, hashes = _parsed_registration(orjson.dumps(reg, option=_SORTED))
    except (KeyError, TypeError, ValueError, binascii.Error, LedgerError) as exc:
        raise _fail("collector_key", f"malformed key registration: {exc}") from exc
    body = env.body
    if env.kind != "key_registration" or body.get("key_id") != record.key_id:
        raise _fail("collector_key", "the registration is not of the key that signed the record")
    if body.get("public_key") != entry.get("public_key"):
        raise _fail("collector_key", "the registered public key differs from the bundle's key")
    if record.kind not in SIGNABLE_KINDS.get(str(body.get("role")), ()):
        raise _fail("collector_key", f"a {body.get('role')!r} key may not sign {record.kind!r}")
    if reg_index >= record_index:
        raise _fail("collector_key", "the key was registered after the record was logged")
    try:
        _verified_registration(env.canonical, log_pub.raw, reg_index, tree_size, hashes, root_hash)
    except VerificationError as exc:
        raise _fail("collector_key", exc.message, exc.code) from exc


# Bundles exported together share their checkpoint and their collector key's registration
# with its inclusion proof: each distinct set of inputs is verified once. Verification is a
# pure function of these values, and failures are never cached (they raise).
@functools.lru_cache(maxsize=256)
def _verified_checkpoint(note: str, log_key_raw: bytes) -> Checkpoint:
    return verify_checkpoint(note, Ed25519PublicKey.from_public_bytes(log_key_raw))


@functools.lru_cache(maxsize=1024)
def _parsed_registration(document: bytes) -> tuple[Envelope, int, tuple[bytes, ...]]:
    """A registration member (as sorted JSON bytes): its envelope, leaf index and proof."""
    reg = orjson.loads(document)
    env = Envelope.from_dict(reg.get("envelope"))
    reg_index = reg["leaf_index"]
    if not isinstance(reg_index, int):
        raise TypeError("leaf_index")
    return env, reg_index, tuple(_b64decode(h) for h in reg["hashes"])


@functools.lru_cache(maxsize=1024)
def _verified_registration(
    canonical: bytes,
    log_key_raw: bytes,
    index: int,
    tree_size: int,
    proof: tuple[bytes, ...],
    root_hash: bytes,
) -> None:
    verify_envelope(
        Envelope.from_dict(json.loads(canonical)), Ed25519PublicKey.from_public_bytes(log_key_raw)
    )
    merkle.verify_inclusion(merkle.leaf_hash(canonical), index, tree_size, proof, root_hash)
