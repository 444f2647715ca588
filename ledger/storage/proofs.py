"""Proofs and evidence from storage: inclusion, consistency, and evidence bundles."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import bindparam, exists, select, true
from sqlalchemy.orm import Session, aliased

from ledger import merkle
from ledger.canonical import digest_of, sha256_digest
from ledger.checkpoint import parse_checkpoint, verifier_key
from ledger.clock import rfc3339
from ledger.disclosures import parse
from ledger.errors import Conflict, IndexMismatch, LedgerError, StorageError
from ledger.evidence import b64 as _b64
from ledger.evidence import build_bundle, proven_leaf
from ledger.inference_record import parse_record
from ledger.record_v2 import SCHEMA_VERSION as V2
from ledger.record_v2 import check_redact, is_redacted
from ledger.records import RECORD_KIND
from ledger.replay import VERDICT_KIND
from ledger.signing import SigningKey, public_key_raw
from ledger.storage import checkpoints, keystore, queries, tree
from ledger.storage.database import Database, utcnow
from ledger.storage.models import (
    CheckpointRow,
    Erasure,
    Fingerprint,
    LogEntry,
    Record,
    Replay,
)
from ledger.storage.models import SigningKey as KeyRow

T = TypeVar("T")


def _checked(session: Session, tree_size: int, fn: Callable[[], T]) -> T:
    """Run a proof; if nodes are missing because the tree is smaller, say so (422)."""
    try:
        return fn()
    except tree.MissingNodes:
        checkpoints.check_tree_size(session, tree_size)
        raise


def inclusion(db: Database, index: int, tree_size: int) -> dict[str, Any]:
    """An inclusion proof and the leaf hash, from one read of stored nodes."""
    leaf = (0, index)
    with db.read() as s:

        def prove() -> tuple[list[bytes], bytes]:
            plan = merkle.inclusion_plan(index, tree_size)  # refuses a bad index or size
            hashes = tree.node_reader(s)([*plan, leaf])
            proof = merkle.inclusion_proof(index, tree_size, merkle.from_hashes(hashes))
            return proof, hashes[leaf]

        proof, leaf_hash = _checked(s, tree_size, prove)
    return {
        "index": index,
        "tree_size": tree_size,
        "leaf_hash": _b64(leaf_hash),
        "hashes": [_b64(h) for h in proof],
    }


def consistency(db: Database, first: int, second: int) -> dict[str, Any]:
    with db.read() as s:
        read = tree.node_reader(s)
        hashes = _checked(s, second, lambda: merkle.consistency_proof(first, second, read))
        if not hashes:  # first 0 or first == second: no node was read, so no size was checked
            checkpoints.check_tree_size(s, second)
    return {"first": first, "second": second, "hashes": [_b64(h) for h in hashes]}


def log_key_entry(log_key: SigningKey, origin: str) -> dict[str, Any]:
    return {
        "key_id": log_key.key_id,
        "public_key": "ed25519:" + _b64(public_key_raw(log_key.public_key)),
        "origin": origin,
        "vkey": verifier_key(origin, log_key.public_key),
    }


_Registration = aliased(LogEntry)
_FingerprintEntry = aliased(LogEntry)
_FingerprintKey = aliased(KeyRow)
_FingerprintRegistration = aliased(LogEntry)
_Latest = (
    select(CheckpointRow.tree_size, CheckpointRow.note)
    .order_by(CheckpointRow.tree_size.desc())
    .limit(1)
    .subquery()
)
# Everything an evidence bundle needs but the Merkle nodes and the replays, in one round trip:
# the record's envelope, its signer's registration leaf, the fingerprint it names with its
# signer's registration leaf, the latest checkpoint, and whether any replay verdict is logged
# for it. The index columns used to join (records.fingerprint_id,
# fingerprints.key_id, records.key_id) are compared with the envelopes before serving.
_EVIDENCE = (
    select(
        Record.log_index,
        Record.key_id,
        Record.fingerprint_id,
        LogEntry.envelope,
        KeyRow.log_index.label("key_index"),
        _Registration.envelope.label("registration"),
        Fingerprint.log_index.label("fp_index"),
        Fingerprint.key_id.label("fp_key_id"),
        _FingerprintEntry.envelope.label("fp_envelope"),
        _FingerprintKey.log_index.label("fp_key_index"),
        _FingerprintRegistration.envelope.label("fp_registration"),
        _Latest.c.tree_size,
        _Latest.c.note,
        exists().where(Replay.request_id == Record.request_id).label("has_replays"),
    )
    .join_from(Record, LogEntry, LogEntry.idx == Record.log_index)
    .outerjoin(KeyRow, KeyRow.key_id == Record.key_id)
    .outerjoin(_Registration, _Registration.idx == KeyRow.log_index)
    .outerjoin(Fingerprint, Fingerprint.fingerprint_id == Record.fingerprint_id)
    .outerjoin(_FingerprintEntry, _FingerprintEntry.idx == Fingerprint.log_index)
    .outerjoin(_FingerprintKey, _FingerprintKey.key_id == Fingerprint.key_id)
    .outerjoin(_FingerprintRegistration, _FingerprintRegistration.idx == _FingerprintKey.log_index)
    .outerjoin(_Latest, true())
    .where(Record.request_id == bindparam("request_id"))
)


def evidence(
    db: Database, log_key: SigningKey, origin: str, request_id: str, redact: Sequence[str] = ()
) -> dict[str, Any]:
    """An evidence bundle for a record: envelope, fingerprint, inclusion proofs, covering
    checkpoint, keys, the record's disclosures but those ``redact`` names
    (``ledger.record_v2.is_redacted``) and its erasure event, if any (docs/EVIDENCE.md).

    One read transaction; if no checkpoint covers the record (and its erasure) yet, one is
    signed first. An index row that disagrees with the envelopes it points to is an error,
    never a bundle.
    """
    check_redact(redact)
    bundle = _evidence(db, log_key, origin, request_id, redact)
    if bundle is None:
        record = queries.get_record(db, request_id)  # its erasure read through its leaf
        last = max(record.log_index, record.erasure.log_index if record.erasure else -1)
        checkpoints.covering(db, log_key, origin, last)
        bundle = _evidence(db, log_key, origin, request_id, redact)
    if bundle is None:  # pragma: no cover - covering() raised or signed one
        raise StorageError("no checkpoint covers the record")
    return bundle


def _disagrees(what: str, index: int) -> IndexMismatch:
    return IndexMismatch(f"the {what} index disagrees with log entry {index}; run `ledger audit`")


def _missing(what: str, request_id: str) -> IndexMismatch:
    return IndexMismatch(
        f"{what}, which record {request_id!r} names, has no row in the ledger's index although "
        "ingest logged it first: the index was edited; run `ledger audit`",
        details={"request_id": request_id},
    )


def _check_checkpoint(tree_size: int, note: str) -> None:
    """The latest checkpoint row's size is the one its note signs (the bundle's proofs are
    computed at that size)."""
    try:
        signed = parse_checkpoint(note)[0].tree_size
    except LedgerError:
        signed = None
    if signed != tree_size:
        raise IndexMismatch(
            f"the checkpoint row of tree size {tree_size} does not agree with its signed note; "
            "run `ledger audit`",
            details={"tree_size": tree_size},
        )


def _check_content(
    body: dict[str, Any], disclosures: list[str], erased: bool, log_index: int
) -> None:
    """A v2 record's stored content agrees with the erasure index: all of it, or none and
    an erasure event; anything else is an edited database, never a bundle."""
    if body.get("schema_version") == 1:
        return
    try:
        complete = parse_record(body, disclosures).complete
    except LedgerError:
        raise _disagrees("disclosures", log_index) from None
    if (erased and disclosures) or (not erased and not complete):
        raise _disagrees("disclosures", log_index)


def _verdicts(request_id: str, replays: Sequence[Any]) -> list[tuple[int, dict[str, Any]]]:
    """The record's replay verdicts its ``replays`` rows point at, each a verdict about it
    (a row pointing at any other leaf is a mismatch, never a bundle's verdict)."""
    out = []
    for r in replays:
        env = json.loads(r.envelope)
        body = env.get("body") if isinstance(env, dict) else None
        if (
            not isinstance(body, dict)
            or env.get("kind") != VERDICT_KIND
            or body.get("request_id") != request_id
        ):
            raise _disagrees("replays", r.log_index)
        out.append((r.log_index, env))
    return out


def _check_erased(
    body: dict[str, Any],
    verdicts: Sequence[tuple[int, dict[str, Any]]],
    erasure: queries.ErasureEvent,
) -> None:
    """Every digest the erasure event names is one the record or a verdict in the bundle
    commits to: a verdict whose ``replays`` row is gone would leave its output's digest
    unexplained, and the bundle would not verify (a mismatch here, never such a bundle)."""
    committed = set(body.get("disclosure_digests") or ())
    committed.update(env["body"].get("output_digest") for _, env in verdicts)
    if not set(erasure.body.get("erased_digests") or ()) <= committed:
        raise _disagrees("replays", erasure.log_index)


def _erasure(
    session: Session, request_id: str, record_index: int, envelope: bytes
) -> queries.ErasureEvent | None:
    """The record's erasure event, read through the leaf its ``erasures`` row names: a row
    naming any other leaf (or none) is ``index_mismatch``, never a bundle's ``erasure``."""
    row = session.execute(
        select(Erasure.log_index, LogEntry.envelope)
        .outerjoin(LogEntry, LogEntry.idx == Erasure.log_index)
        .where(Erasure.request_id == request_id)
    ).first()
    if row is None:
        return None
    record, body = queries.logged_envelope(bytes(envelope), record_index, RECORD_KIND)
    return queries.logged_erasure(
        row.envelope,
        row.log_index,
        request_id=request_id,
        record_index=record_index,
        content_hash=sha256_digest(body),
        digests=record["body"].get("disclosure_digests"),
    )


def _evidence(
    db: Database, log_key: SigningKey, origin: str, request_id: str, redact: Sequence[str]
) -> dict[str, Any] | None:
    with db.read() as s:
        row = s.execute(_EVIDENCE, {"request_id": request_id}).first()
        if row is None:
            raise queries.not_found(request_id)
        if row.tree_size is None or row.tree_size <= row.log_index:
            return None
        _check_checkpoint(row.tree_size, row.note)
        erasure = _erasure(s, request_id, row.log_index, row.envelope)
        if erasure is not None and erasure.log_index >= row.tree_size:
            return None
        disclosures = queries.disclosures_at(s, [row.log_index]).get(row.log_index, [])
        # ingest refuses a record whose key or fingerprint is not logged, so a row missing
        # here was deleted: an edited index, never a database to retry
        if row.key_index is None or row.registration is None:
            raise _missing(f"signing key {row.key_id}", request_id)
        if row.fp_index is None or row.fp_envelope is None:
            raise _missing(f"fingerprint {row.fingerprint_id}", request_id)
        if row.fp_key_index is None or row.fp_registration is None:
            raise _missing(f"signing key {row.fp_key_id}", request_id)
        replays = (
            s.execute(
                select(Replay.log_index, LogEntry.envelope)
                .join(LogEntry, LogEntry.idx == Replay.log_index)
                .where(Replay.request_id == request_id, Replay.log_index < row.tree_size)
                .order_by(Replay.log_index)
            ).all()
            if row.has_replays
            else []
        )
        tree_size = row.tree_size
        leaves = [row.log_index, row.key_index, row.fp_index, row.fp_key_index]
        leaves += [r.log_index for r in replays]
        if erasure is not None:
            leaves.append(erasure.log_index)
        hashes = tree.node_reader(s)(
            [i for leaf in dict.fromkeys(leaves) for i in merkle.inclusion_plan(leaf, tree_size)]
        )
    envelope = json.loads(row.envelope)
    if redact and envelope["body"].get("schema_version") != V2:
        raise Conflict(
            f"record {request_id!r} is schema v1: its content is part of its signed envelope, "
            "so no bundle of it can leave any out (ask without redact for the whole bundle)",
            code="not_redactable",
            details={"request_id": request_id, "redact": list(redact)},
        )
    _check_content(envelope["body"], disclosures, erasure is not None, row.log_index)
    verdicts = _verdicts(request_id, replays)
    if erasure is not None:
        _check_erased(envelope["body"], verdicts, erasure)
    fingerprint = json.loads(row.fp_envelope)
    if envelope["body"].get("fingerprint_id") != row.fingerprint_id:
        raise _disagrees("records.fingerprint_id", row.log_index)
    if envelope["signature"]["key_id"] != row.key_id:
        raise _disagrees("records.key_id", row.log_index)
    if digest_of(fingerprint["body"]) != row.fingerprint_id:
        raise _disagrees("fingerprints.log_index", row.fp_index)
    if fingerprint["signature"]["key_id"] != row.fp_key_id:
        raise _disagrees("fingerprints.key_id", row.fp_index)
    read = merkle.from_hashes(hashes)

    def proven(env: dict[str, Any], index: int) -> dict[str, Any]:
        return proven_leaf(env, index, merkle.inclusion_proof(index, tree_size, read))

    def key(key_id: str, reg: bytes | None, idx: int) -> dict[str, Any]:
        """A signer's entry: its name, role and public key as its registration leaf says
        (an index row pointing at any other leaf is a mismatch, never a bundle)."""
        env = json.loads(reg) if reg is not None else {}
        body = env.get("body") if isinstance(env, dict) else None
        if (
            not isinstance(body, dict)
            or env.get("kind") != keystore.REGISTRATION_KIND
            or body.get("key_id") != key_id
        ):
            raise _disagrees("signing_keys.log_index", idx)
        return {
            "key_id": key_id,
            "name": body.get("name"),
            "role": body.get("role"),
            "public_key": body.get("public_key"),
            "registration": proven(env, idx),
        }

    return build_bundle(
        envelope=envelope,
        leaf_index=row.log_index,
        tree_size=tree_size,
        proof=merkle.inclusion_proof(row.log_index, tree_size, read),
        checkpoint_note=row.note,
        fingerprint=proven(fingerprint, row.fp_index),
        collector_key=key(row.key_id, row.registration, row.key_index),
        fingerprint_signer=key(row.fp_key_id, row.fp_registration, row.fp_key_index),
        log_key=log_key_entry(log_key, origin),
        exported_at=rfc3339(utcnow()),
        replays=[proven(env, index) for index, env in verdicts],
        disclosures=[d for d in disclosures if not is_redacted(parse(d).member, redact)],
        erasure=(
            proven(json.loads(erasure.envelope), erasure.log_index) if erasure is not None else None
        ),
    )
