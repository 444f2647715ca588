"""The ``disclosures`` and ``erasure`` checks of a bundle: what of the record's content it
proves, and what the ledger erased (pure; run by ``ledger.evidence.verify_bundle``).

``disclosures``: every disclosure the bundle carries opens one digest of the signed record
body (``ledger.disclosures``: well formed, one of the body's digests, none twice); a schema v1
record carries none (its content is in the signed body itself).

``erasure``: the erasure event, when carried, is signed by the log key, proven in the same
tree, logged after the record, and names this record (request ID, leaf index, content hash).

Each digest of the body is then reported ``disclosed`` (opened by a carried disclosure),
``erased`` (not carried; the erasure event names it) or ``redacted`` (not carried, not
erased: the exporter left it out).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

from ledger import merkle
from ledger.checkpoint import Checkpoint
from ledger.erasure import ERASURE_KIND
from ledger.errors import LedgerError, VerificationError
from ledger.evidence_format import ProvenLeaf, fail
from ledger.fingerprint_facts import shown
from ledger.inference_record import parse_record
from ledger.signing import Envelope, VerifyingKey, verify_envelope

STATUSES = ("disclosed", "redacted", "erased")


class ContentItem(NamedTuple):  # one per digest of every bundle verified: a tuple builds fast
    digest: str
    member: str | None  # known only when disclosed
    status: str  # one of STATUSES

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "member": self.member, "status": self.status}


@dataclass(frozen=True)
class ErasureSummary:
    leaf_index: int
    reason_code: str | None
    reason: str | None
    requested_by: str | None
    erased_at: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "leaf_index": self.leaf_index,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "requested_by": self.requested_by,
            "erased_at": self.erased_at,
        }


@dataclass(frozen=True)
class ContentReport:
    schema_version: int
    items: tuple[ContentItem, ...]  # one per digest (empty for schema v1: content in the leaf)
    erasure: ErasureSummary | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "content": [i.to_dict() for i in self.items],
            "erasure": self.erasure.to_dict() if self.erasure else None,
        }


def verify_content(
    disclosures: tuple[object, ...],
    erasure: ProvenLeaf | None,
    record: Envelope,
    record_index: int,
    cp: Checkpoint,
    log_key: VerifyingKey,
    replay_outputs: Collection[str] = (),
) -> ContentReport:
    """``replay_outputs``: the ``output_digest`` of each replay verdict the bundle carries (an
    erasure erases the record's replay outputs with its content)."""
    try:
        parsed = parse_record(record.body, disclosures)
    except VerificationError as exc:
        raise fail("disclosures", exc.message, exc.code) from exc
    except LedgerError as exc:
        raise fail("disclosures", f"the record body is not a valid record: {exc.message}") from exc
    erased: set[str] = set()
    summary = None
    if erasure is not None:
        summary, erased = _verify_erasure(erasure, record, record_index, cp, log_key)
        unknown = erased - set(parsed.digests) - set(replay_outputs)
        if unknown:
            raise fail(
                "erasure",
                f"the erasure event names {len(unknown)} digest(s) that neither the record nor "
                "its replay verdicts in this bundle commit to",
            )
    by_digest = {d.digest: d.member for d in parsed.disclosed.values()}
    items = tuple(
        ContentItem(
            digest,
            by_digest.get(digest),
            "disclosed" if digest in by_digest else "erased" if digest in erased else "redacted",
        )
        for digest in parsed.digests
    )
    return ContentReport(parsed.schema_version, items, summary)


def verify_log_leaf(item: ProvenLeaf, cp: Checkpoint, log_key: VerifyingKey) -> None:
    """A leaf the log key signed, proven in the checkpoint's tree (VerificationError)."""
    verify_envelope(item.envelope, log_key)
    merkle.verify_inclusion(
        merkle.leaf_hash(item.envelope.canonical),
        item.index,
        cp.tree_size,
        item.proof,
        cp.root_hash,
    )


def _verify_erasure(
    item: ProvenLeaf, record: Envelope, record_index: int, cp: Checkpoint, log_key: VerifyingKey
) -> tuple[ErasureSummary, set[str]]:
    env, body = item.envelope, item.envelope.body
    if env.kind != ERASURE_KIND or body.get("request_id") != record.body.get("request_id"):
        raise fail("erasure", "the erasure member is not an erasure event of this record")
    about = body.get("record")
    about = about if isinstance(about, dict) else {}
    if about.get("content_hash") != record.body_digest or about.get("log_index") != record_index:
        raise fail("erasure", "the erasure event names another version or leaf of the record")
    if item.index <= record_index:
        raise fail("erasure", "the erasure event is logged before the record")
    digests = body.get("erased_digests")
    if not isinstance(digests, list) or not all(isinstance(d, str) for d in digests):
        raise fail("erasure", "the erasure event's erased_digests is not a list of digests")
    try:
        verify_log_leaf(item, cp, log_key)
    except VerificationError as exc:
        raise fail("erasure", f"erasure: {exc.message}", exc.code) from exc
    return (
        ErasureSummary(
            leaf_index=item.index,
            reason_code=shown(body.get("reason_code")),
            reason=shown(body.get("reason")),
            requested_by=shown(body.get("requested_by")),
            erased_at=shown(body.get("erased_at")),
        ),
        set(digests),
    )
