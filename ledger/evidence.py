"""Evidence bundles (pure): one JSON document that proves a record offline.

Format ``inference-ledger/evidence/v3``::

    {
      "format": "inference-ledger/evidence/v3",
      "request_id": "req-…",
      "envelope": {"kind": "inference_record", "body": {…}, "signature": {…}},
      "leaf_index": 41,
      "leaf_hash": "<base64 SHA-256(0x00 || JCS(envelope))>",
      "inclusion_proof": {"tree_size": 97, "hashes": ["<base64>", …]},
      "checkpoint": "<C2SP signed note covering tree_size>",
      "fingerprint": {"envelope": {<the fingerprint the record names, as logged>},
                      "leaf_index": 2, "hashes": ["<base64>", …]},
      "keys": {
        "collector": {"key_id": "ed25519:…", "name": "…", "role": "collector",
                      "public_key": "ed25519:<base64 raw>",
                      "registration": {"envelope": {<key_registration, signed by the log key>},
                                       "leaf_index": 1, "hashes": ["<base64>", …]}},
        "fingerprint_signer": {<the same, for the key that signed the fingerprint>},
        "log": {"key_id": "ed25519:…", "public_key": "ed25519:<base64 raw>",
                "origin": "…", "vkey": "<C2SP verifier key>"}
      },
      "replays": [{"envelope": {<replay_verdict, signed by the log key>},
                   "leaf_index": 57, "hashes": ["<base64>", …]}],
      "disclosures": ["<base64url>", …],
      "erasure": {"envelope": {<erasure, signed by the log key>}, "leaf_index": 60,
                  "hashes": ["<base64>", …]},            # only once erased
      "exported_at": "2026-11-29T10:00:00.000000Z"
    }

Format ``v3`` adds ``"disclosures": ["<base64url>", …]`` (the record's salted disclosures the
bundle carries: all, a subset chosen with ``--redact``, none once erased) and, for a record
whose content was erased, ``"erasure": {"envelope", "leaf_index", "hashes"}`` (the event,
signed by the log key); see :mod:`ledger.evidence_content`.

Every inclusion proof is in the tree of the one checkpoint. ``replays`` holds the record's
replay verdicts logged under that checkpoint (possibly none). Members and their parsing:
:mod:`ledger.evidence_format`, which also reads ``v1`` bundles (no fingerprint).

:func:`verify_bundle` runs the checks of :data:`CHECKS` in order and raises
:class:`VerificationError` whose ``details["check"]`` names the first that failed. Every
member that repeats a signed fact (``request_id``, a key's ``name``, ``role``, ``key_id`` and
``public_key``, the log key's ``origin`` and ``vkey``, every ``leaf_index``) must equal it;
only ``exported_at`` is unverified (nothing signs it). ``collector_key`` and
``fingerprint_key`` prove that the signing key was registered in the same log, by the log key,
before the leaf it signed: a row slipped into the database with a key the log never
registered fails them. A revocation after the leaf cannot be proven absent offline; ``ledger
audit`` checks it.
"""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger import merkle
from ledger.canonical import canonicalize
from ledger.checkpoint import Checkpoint, verifier_key, verify_checkpoint
from ledger.errors import VerificationError
from ledger.evidence_content import ContentReport, verify_content, verify_log_leaf
from ledger.evidence_format import (
    FORMAT,
    FORMAT_V1,
    KeyEntry,
    ProvenLeaf,
    fail,
    parse_bundle,
)
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.fingerprint_facts import FingerprintFacts, shown
from ledger.key_scope import out_of_scope, registered_pools
from ledger.signing import (
    SIGNABLE_KINDS,
    Envelope,
    VerifyingKey,
    key_id_of,
    public_key_raw,
    verify_envelope,
)

__all__ = [
    "CHECKS",
    "FINGERPRINT_CHECKS",
    "FORMAT",
    "FORMAT_V1",
    "FingerprintFacts",
    "ReplaySummary",
    "VerifiedBundle",
    "b64",
    "build_bundle",
    "verify_bundle",
]

REGISTRATION_KIND = "key_registration"
CHECKS = (
    "format",
    "jcs",
    "collector_signature",
    "request_id",
    "log_key_pin",
    "checkpoint_signature",
    "inclusion_proof",
    "collector_key",
    "fingerprint",
    "fingerprint_signature",
    "fingerprint_inclusion",
    "fingerprint_key",
    "replays",
    "disclosures",
    "erasure",
)
# What a v1 bundle cannot be checked for: it carries no fingerprint.
FINGERPRINT_CHECKS = (
    "fingerprint",
    "fingerprint_signature",
    "fingerprint_inclusion",
    "fingerprint_key",
)
_CHECKS_V1 = tuple(c for c in CHECKS if c not in FINGERPRINT_CHECKS)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def proven_leaf(envelope: dict[str, Any], index: int, proof: list[bytes]) -> dict[str, Any]:
    """A ``{"envelope", "leaf_index", "hashes"}`` member."""
    return {"envelope": envelope, "leaf_index": index, "hashes": [b64(h) for h in proof]}


def build_bundle(
    *,
    envelope: dict[str, Any],
    leaf_index: int,
    tree_size: int,
    proof: list[bytes],
    checkpoint_note: str,
    fingerprint: dict[str, Any],
    collector_key: dict[str, Any],
    fingerprint_signer: dict[str, Any],
    log_key: dict[str, Any],
    exported_at: str,
    replays: list[dict[str, Any]],
    disclosures: list[str],
    erasure: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A v3 bundle. ``fingerprint``, each replay and ``erasure`` are :func:`proven_leaf`
    members; the two keys are ``{"key_id", "name", "role", "public_key", "registration":
    <proven_leaf>}``."""
    extra: dict[str, Any] = {"erasure": erasure} if erasure is not None else {}
    return {
        "format": FORMAT,
        "request_id": envelope.get("body", {}).get("request_id"),
        "envelope": envelope,
        "leaf_index": leaf_index,
        "leaf_hash": b64(merkle.leaf_hash(canonicalize(envelope))),
        "inclusion_proof": {"tree_size": tree_size, "hashes": [b64(h) for h in proof]},
        "checkpoint": checkpoint_note,
        "fingerprint": fingerprint,
        "keys": {
            "collector": collector_key,
            "fingerprint_signer": fingerprint_signer,
            "log": log_key,
        },
        "replays": replays,
        "disclosures": disclosures,
        **extra,
        "exported_at": exported_at,
    }


@dataclass(frozen=True)
class ReplaySummary:
    """A replay verdict the bundle proves, as the log key signed it."""

    replay_id: str | None
    leaf_index: int
    verdict: str | None
    pool: str | None
    worker_id: str | None
    worker_key_id: str | None  # None in verdicts from before verdicts named the worker's key

    def to_dict(self) -> dict[str, Any]:
        return {
            "replay_id": self.replay_id,
            "leaf_index": self.leaf_index,
            "verdict": self.verdict,
            "pool": self.pool,
            "worker_id": self.worker_id,
            "worker_key_id": self.worker_key_id,
        }


@dataclass(frozen=True)
class VerifiedBundle:
    format: str
    checks: tuple[str, ...]  # the checks that ran (a v1 bundle skips FINGERPRINT_CHECKS)
    request_id: str
    kind: str
    leaf_index: int
    tree_size: int
    root_hash: bytes
    origin: str
    checkpoint_signed_at: (
        datetime | None
    )  # the checkpoint's signed timestamp (None: a note without one)
    collector_key_id: str
    collector_name: str
    collector_role: str
    # the pools the collector key was registered for (None: any pool), as the log key signed
    collector_pools: tuple[str, ...] | None
    log_key_id: str
    log_key_pinned: bool
    fingerprint: FingerprintFacts | None  # None: a v1 bundle, which carries none
    replays: tuple[ReplaySummary, ...]
    content: ContentReport  # each committed member: disclosed, redacted or erased

    @property
    def replay_verdicts(self) -> tuple[str, ...]:
        return tuple(str(r.verdict) for r in self.replays)


def verify_bundle(bundle: Any, pinned_log_key: Ed25519PublicKey | None) -> VerifiedBundle:
    """Verify a bundle fully offline; raises VerificationError naming the failed check.

    ``pinned_log_key`` is the log's public key obtained out of band. ``None`` (an explicit
    choice) checks the bundle against the log key it carries: self-consistency only, and the
    result says ``log_key_pinned=False``.
    """
    b = parse_bundle(bundle)  # format
    record, index = b.record, b.leaf_index

    leaf = merkle.leaf_hash(record.canonical)
    if leaf != b.leaf_hash:
        raise fail("jcs", "the envelope's canonical bytes do not hash to the logged leaf")

    try:
        verify_envelope(record, b.collector.key)
    except VerificationError as exc:
        raise fail("collector_signature", exc.message, exc.code) from exc

    if b.request_id != record.body.get("request_id"):
        raise fail("request_id", "request_id differs from the request ID the collector signed")

    log_key = b.log.key
    if pinned_log_key is not None and public_key_raw(pinned_log_key) != log_key.raw:
        raise fail(
            "log_key_pin",
            "the checkpoint is signed by a key other than the pinned log key",
            "log_key_mismatch",
        )
    try:
        cp = _verified_checkpoint(b.checkpoint, log_key.raw)
    except VerificationError as exc:
        raise fail("checkpoint_signature", exc.message, exc.code) from exc
    if b.log.origin != cp.origin:
        raise fail("checkpoint_signature", "keys.log.origin is not the checkpoint's origin")
    if b.log.vkey != _vkey(cp.origin, log_key.raw):
        raise fail("checkpoint_signature", "keys.log.vkey is not the log key's verifier key")

    if cp.tree_size != b.tree_size:
        raise fail(
            "inclusion_proof",
            f"proof is for tree size {b.tree_size}, the checkpoint for {cp.tree_size}",
            "bad_inclusion_proof",
        )
    try:
        merkle.verify_inclusion(leaf, index, cp.tree_size, b.proof, cp.root_hash)
    except VerificationError as exc:
        raise fail("inclusion_proof", exc.message, exc.code) from exc

    _verify_key("collector_key", b.collector, record, index, cp, log_key)
    facts = None
    if b.fingerprint is not None and b.fingerprint_signer is not None:
        facts = _verify_fingerprint(b.fingerprint, b.fingerprint_signer, record, index, cp)
        fp_env, fp_index = b.fingerprint.envelope, b.fingerprint.index
        _verify_key("fingerprint_key", b.fingerprint_signer, fp_env, fp_index, cp, log_key)
    replays = _verify_replays(b.replays, record, index, cp, log_key)
    outputs = [r.envelope.body.get("output_digest") for r in b.replays]
    content = verify_content(
        b.disclosures,
        b.erasure,
        record,
        index,
        cp,
        log_key,
        [d for d in outputs if isinstance(d, str)],
    )
    return VerifiedBundle(
        format=b.format,
        checks=CHECKS if facts else _CHECKS_V1,
        request_id=b.request_id,
        kind=record.kind,
        leaf_index=index,
        tree_size=cp.tree_size,
        root_hash=cp.root_hash,
        origin=cp.origin,
        checkpoint_signed_at=cp.signed_at,
        collector_key_id=record.key_id,
        collector_name=b.collector.name,
        collector_role=b.collector.role,
        collector_pools=registered_pools(b.collector.registration.envelope.body),
        log_key_id=log_key.key_id,
        log_key_pinned=pinned_log_key is not None,
        fingerprint=facts,
        replays=replays,
        content=content,
    )


def _verify_fingerprint(
    fp: ProvenLeaf, signer: KeyEntry, record: Envelope, record_index: int, cp: Checkpoint
) -> FingerprintFacts:
    """The fingerprint the record names, signed by its signer, in the same tree, before it."""
    env = fp.envelope
    if env.kind != FINGERPRINT_KIND:
        raise fail("fingerprint", f"the fingerprint member holds a {env.kind!r} envelope")
    named = record.body.get("fingerprint_id")
    if env.body_digest != named:
        raise fail(
            "fingerprint",
            f"the fingerprint's canonical body hashes to {env.body_digest}, but the record "
            f"names {named}",
            "fingerprint_mismatch",
        )
    if fp.index >= record_index:
        raise fail("fingerprint", "the fingerprint is logged after the record that names it")
    try:
        _verified_signature(env.canonical, signer.key.raw)
    except VerificationError as exc:
        raise fail("fingerprint_signature", exc.message, exc.code) from exc
    try:
        _verified_inclusion(env.canonical, fp.index, cp.tree_size, fp.proof, cp.root_hash)
    except VerificationError as exc:
        raise fail("fingerprint_inclusion", exc.message, exc.code) from exc
    return _facts(env.canonical, fp.index)


def _verify_key(
    check: str,
    entry: KeyEntry,
    signed: Envelope,
    signed_index: int,
    cp: Checkpoint,
    log_key: VerifyingKey,
) -> None:
    """The key that signed a leaf: its registration is an earlier leaf of the same tree,
    signed by the log key, and every member of the bundle's key entry is what it registered."""
    reg = entry.registration
    body = reg.envelope.body
    if reg.envelope.kind != REGISTRATION_KIND or body.get("key_id") != signed.key_id:
        raise fail(check, "the registration is not of the key that signed the leaf")
    for member in ("key_id", "name", "role", "public_key"):
        held = entry.key.key_id if member == "key_id" else getattr(entry, member)
        if body.get(member) != held:
            raise fail(check, f"the bundle's key {member} differs from the one registered")
    if signed.kind not in SIGNABLE_KINDS.get(str(body.get("role")), ()):
        raise fail(check, f"a {body.get('role')!r} key may not sign {signed.kind!r}")
    problem = out_of_scope(registered_pools(body), signed.kind, signed.body)
    if problem is not None:
        raise fail(check, problem)
    if reg.index >= signed_index:
        raise fail(check, "the key was registered after the leaf it signed was logged")
    try:
        _verified_signature(reg.envelope.canonical, log_key.raw)
        _verified_inclusion(
            reg.envelope.canonical, reg.index, cp.tree_size, reg.proof, cp.root_hash
        )
    except VerificationError as exc:
        raise fail(check, exc.message, exc.code) from exc


def _verify_replays(
    items: tuple[ProvenLeaf, ...],
    record: Envelope,
    record_index: int,
    cp: Checkpoint,
    log_key: VerifyingKey,
) -> tuple[ReplaySummary, ...]:
    """Each replay verdict: signed by the log key, about this record, in the same tree."""
    verdicts = []
    previous = record_index
    for i, item in enumerate(items):
        env, body = item.envelope, item.envelope.body
        if env.kind != "replay_verdict" or body.get("request_id") != record.body.get("request_id"):
            raise fail("replays", f"replays[{i}] is not a verdict about this record")
        about = body.get("record")
        about = about if isinstance(about, dict) else {}
        if about.get("content_hash") != record.body_digest:
            raise fail("replays", f"replays[{i}] compares another version of the record")
        if about.get("log_index") != record_index:
            raise fail("replays", f"replays[{i}] names another leaf index for the record")
        if about.get("fingerprint_id") != record.body.get("fingerprint_id"):
            raise fail("replays", f"replays[{i}] names another fingerprint for the record")
        if item.index <= previous:
            raise fail(
                "replays",
                f"replays[{i}] is logged before the record or out of leaf order",
            )
        previous = item.index
        try:
            verify_log_leaf(item, cp, log_key)
        except VerificationError as exc:
            raise fail("replays", f"replays[{i}]: {exc.message}", exc.code) from exc
        verdicts.append(
            ReplaySummary(
                replay_id=shown(body.get("replay_id")),
                leaf_index=item.index,
                verdict=shown(body.get("verdict")),
                pool=shown(body.get("pool")),
                worker_id=shown(body.get("worker_id")),
                worker_key_id=shown(body.get("worker_key_id")),
            )
        )
    return tuple(verdicts)


# Bundles exported together share their checkpoint, their keys' registrations and their
# fingerprint with their inclusion proofs: each distinct set of inputs is verified once.
# Verification is a pure function of these values, and failures are never cached (they raise).
@functools.lru_cache(maxsize=256)
def _verified_checkpoint(note: str, log_key_raw: bytes) -> Checkpoint:
    return verify_checkpoint(note, Ed25519PublicKey.from_public_bytes(log_key_raw))


@functools.lru_cache(maxsize=256)
def _vkey(origin: str, log_key_raw: bytes) -> str:
    return verifier_key(origin, Ed25519PublicKey.from_public_bytes(log_key_raw))


@functools.lru_cache(maxsize=1024)
def _verified_signature(canonical: bytes, key_raw: bytes) -> None:
    """An envelope (as its canonical bytes) is signed by the key."""
    verify_envelope(Envelope.from_bytes(canonical), VerifyingKey(key_raw, key_id_of(key_raw)))


@functools.lru_cache(maxsize=256)
def _facts(canonical: bytes, index: int) -> FingerprintFacts:
    env = Envelope.from_bytes(canonical)
    return FingerprintFacts.of(env.body, env.body_digest, index, env.key_id)


@functools.lru_cache(maxsize=1024)
def _verified_inclusion(
    canonical: bytes, index: int, tree_size: int, proof: tuple[bytes, ...], root_hash: bytes
) -> None:
    merkle.verify_inclusion(merkle.leaf_hash(canonical), index, tree_size, proof, root_hash)
