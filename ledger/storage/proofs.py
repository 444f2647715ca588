"""Proofs and evidence from storage: inclusion, consistency, and evidence bundles."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger import merkle
from ledger.checkpoint import verifier_key
from ledger.errors import StorageError
from ledger.evidence import b64 as _b64
from ledger.evidence import build_bundle
from ledger.signing import SigningKey, public_key_raw
from ledger.storage import checkpoints, keystore, log, queries, tree
from ledger.storage.database import Database, utcnow
from ledger.storage.models import LogEntry, Replay

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
    return {"first": first, "second": second, "hashes": [_b64(h) for h in hashes]}


def log_key_entry(log_key: SigningKey, origin: str) -> dict[str, Any]:
    return {
        "key_id": log_key.key_id,
        "public_key": "ed25519:" + _b64(public_key_raw(log_key.public_key)),
        "origin": origin,
        "vkey": verifier_key(origin, log_key.public_key),
    }


def evidence(db: Database, log_key: SigningKey, origin: str, request_id: str) -> dict[str, Any]:
    """An evidence bundle for a record: envelope, inclusion proof, covering checkpoint, keys.

    One read transaction; if no checkpoint covers the record yet, one is signed first.
    """
    bundle = _evidence(db, log_key, origin, request_id)
    if bundle is None:
        record = queries.get_record(db, request_id)
        checkpoints.covering(db, log_key, origin, record.log_index)
        bundle = _evidence(db, log_key, origin, request_id)
    if bundle is None:  # pragma: no cover - covering() raised or signed one
        raise StorageError("no checkpoint covers the record")
    return bundle


def _evidence(
    db: Database, log_key: SigningKey, origin: str, request_id: str
) -> dict[str, Any] | None:
    with db.read() as s:
        record = queries.record_in(s, request_id)
        cp = checkpoints.latest_in(s)
        if cp is None or cp.tree_size <= record.log_index:
            return None
        signer = keystore.load_keys(s, [record.key_id]).get(record.key_id)
        if signer is None:
            raise StorageError(f"signing key {record.key_id} missing from the registry")
        registration = log.read_envelope(s, signer.log_index)
        replays = s.execute(
            select(Replay.log_index, LogEntry.envelope)
            .join(LogEntry, LogEntry.idx == Replay.log_index)
            .where(Replay.request_id == request_id, Replay.log_index < cp.tree_size)
            .order_by(Replay.log_index)
        ).all()
        hashes = tree.node_reader(s)(
            [
                *merkle.inclusion_plan(record.log_index, cp.tree_size),
                *merkle.inclusion_plan(signer.log_index, cp.tree_size),
                *(i for r in replays for i in merkle.inclusion_plan(r.log_index, cp.tree_size)),
            ]
        )
    if registration is None:
        raise StorageError(f"registration of {record.key_id} missing from the log")
    from_memory = merkle.from_hashes(hashes)

    return build_bundle(
        envelope=json.loads(record.envelope),
        leaf_index=record.log_index,
        tree_size=cp.tree_size,
        proof=merkle.inclusion_proof(record.log_index, cp.tree_size, from_memory),
        checkpoint_note=cp.note,
        collector_key={
            "key_id": signer.key_id,
            "name": signer.name,
            "role": signer.role,
            "public_key": signer.public_key,
        },
        registration=json.loads(registration),
        registration_index=signer.log_index,
        registration_proof=merkle.inclusion_proof(signer.log_index, cp.tree_size, from_memory),
        log_key=log_key_entry(log_key, origin),
        exported_at=utcnow().isoformat(),
        replays=[
            {
                "envelope": json.loads(r.envelope),
                "leaf_index": r.log_index,
                "hashes": [
                    _b64(h) for h in merkle.inclusion_proof(r.log_index, cp.tree_size, from_memory)
                ],
            }
            for r in replays
        ],
    )
