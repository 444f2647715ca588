"""The audit's result: every finding, each naming its check, leaf, and table and column."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The checks, in the order the audit runs them (``Finding.check``):
CHECKS = (
    "database",  # the append-only triggers, and no row-level security, policy or rule
    "sequence",  # indexes contiguous from 0
    "leaf_hash",  # stored leaf hash = SHA-256(0x00 || stored envelope)
    "tree",  # every stored Merkle node equals the node rebuilt from the leaves
    "canonical",  # the stored envelope is valid and in RFC 8785 form
    "signature",  # signed by a key the log registered before the leaf, unrevoked, allowed
    "index",  # every index table column equals what the leaf it points to says
    "time",  # receive times within the signed times of the checkpoints around them
    "coverage",  # no leaf older than the checkpoint interval is left without a checkpoint
    "checkpoint",  # stored checkpoints: signature, row, root, consistency, time
    "trusted_checkpoint",  # checkpoints seen earlier (--checkpoint) still hold
    "content",  # disclosures open their digests; missing ones erased by an event; holds kept
)


@dataclass(frozen=True)
class Finding:
    check: str
    message: str
    index: int | None = None  # the leaf the finding is about, when it is about one
    table: str | None = None  # the table (and column) whose stored value is wrong
    column: str | None = None
    # A record's digests whose disclosures are missing: resolved against the log's erasure
    # events after the scan (``ledger.audit.content``), never reported as they are.
    request_id: str | None = field(default=None, compare=False)
    pending: tuple[str, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "index": self.index,
            "table": self.table,
            "column": self.column,
            "message": self.message,
        }

    def sort_key(self) -> tuple[bool, int, str, str, str, str]:
        return (
            self.index is None,
            self.index or 0,
            self.check,
            self.table or "",
            self.column or "",
            self.message,
        )


@dataclass
class AuditReport:
    leaves: int = 0
    checkpoints: int = 0
    signatures: bool = True
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def first_bad_index(self) -> int | None:
        indexes = [f.index for f in self.findings if f.index is not None]
        return min(indexes) if indexes else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "leaves": self.leaves,
            "checkpoints": self.checkpoints,
            "signatures_checked": self.signatures,
            "seconds": round(self.seconds, 3),
            "first_bad_index": self.first_bad_index,
            "findings": [f.to_dict() for f in self.findings],
        }
