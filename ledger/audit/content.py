"""The ``content`` checks that need the whole log: erasures and legal holds (pure).

The main process notes every erasure event, legal hold and hold release in log order
(:class:`ContentEvents`), each verified under the log key. After the scan,
:func:`resolve` checks that

- every record (or replay verdict) whose stored disclosures do not open all of its digests
  (the ``pending`` findings of ``ledger.audit.leaves``) is covered by an erasure event of
  its request ID logged after it that names every missing digest: a disclosure deleted
  without one is tampering;
- no disclosure or cache-key row of an erased record remains (``content_left``);
- no erasure touched a record that a hold placed before it, and not released before it,
  covered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ledger.audit.report import Finding
from ledger.audit.rows import EPOCH, Micros, RecordRow
from ledger.erasure import ERASURE_KIND, HOLD_KIND, RELEASE_KIND, HoldScope
from ledger.errors import LedgerError
from ledger.signing import Envelope, VerifyingKey, verify_envelope

MARKERS = (b'"kind":"erasure"', b'"kind":"legal_hold"', b'"kind":"hold_release"')


@dataclass(frozen=True)
class ErasureEvent:
    index: int
    request_id: str
    record_index: int | None
    digests: frozenset[str]


@dataclass
class ContentEvents:
    erasures: dict[str, ErasureEvent] = field(default_factory=dict)
    holds: dict[str, tuple[int, HoldScope]] = field(default_factory=dict)
    releases: dict[str, int] = field(default_factory=dict)
    # Releases of a hold no earlier leaf placed, or released already: (leaf, hold ID).
    stray_releases: list[tuple[int, str]] = field(default_factory=list)

    def note(self, env: Envelope, idx: int, log_key: VerifyingKey | None) -> None:
        """Note one event leaf (ignored unless signed by the log key: the signature check of
        ``ledger.audit.leaves`` reports it)."""
        if env.kind not in (ERASURE_KIND, HOLD_KIND, RELEASE_KIND) or log_key is None:
            return
        try:
            verify_envelope(env, log_key)
        except LedgerError:
            return
        body = env.body
        try:
            if env.kind == ERASURE_KIND:
                about = body.get("record")
                record_index = about.get("log_index") if isinstance(about, dict) else None
                self.erasures.setdefault(
                    str(body["request_id"]),
                    ErasureEvent(
                        idx,
                        str(body["request_id"]),
                        record_index if isinstance(record_index, int) else None,
                        frozenset(str(d) for d in body.get("erased_digests") or ()),
                    ),
                )
            elif env.kind == HOLD_KIND:
                self.holds.setdefault(str(body["hold_id"]), (idx, HoldScope.of(body)))
            else:
                hold_id = str(body["hold_id"])
                if hold_id not in self.holds or hold_id in self.releases:
                    self.stray_releases.append((idx, hold_id))
                self.releases.setdefault(hold_id, idx)
        except (KeyError, TypeError, ValueError, AttributeError):
            return  # a malformed body: leaves.py reports it


def resolve(
    found: list[Finding],
    events: ContentEvents,
    content_left: Callable[[Sequence[str]], dict[str, int]],
    record_rows: Callable[[Sequence[str]], list[RecordRow]],
    committed: Callable[[Sequence[tuple[str, int | None]]], dict[str, set[str]]],
) -> list[Finding]:
    """Replace the pending findings with real ones, and add the erasure and hold findings."""
    out: list[Finding] = []
    for f in found:
        if not f.pending:
            out.append(f)
            continue
        event = events.erasures.get(f.request_id or "")
        if (
            event is not None
            and f.index is not None
            and event.index > f.index
            # a record's event names its leaf; a verdict's output is erased with its record
            and (event.record_index == f.index or f.column == "output_digest")
            and set(f.pending) <= event.digests
        ):
            continue
        out.append(
            Finding(
                "content",
                f"record {f.request_id!r} lacks {len(f.pending)} of its disclosures and no "
                "erasure event covers them: content was deleted without a logged erasure",
                f.index,
                "disclosures",
            )
        )
    erased = list(events.erasures.values())
    left = content_left([e.request_id for e in erased]) if erased else {}
    for e in erased:
        if left.get(e.request_id):
            out.append(
                Finding(
                    "content",
                    f"record {e.request_id!r} was erased at leaf {e.index}, but "
                    f"{left[e.request_id]} disclosure or cache-key row(s) of it remain",
                    e.index,
                    "disclosures",
                )
            )
    if erased:
        digests = committed([(e.request_id, e.record_index) for e in erased])
        for e in erased:
            unknown = e.digests - digests.get(e.request_id, set())
            if unknown:
                out.append(
                    Finding(
                        "content",
                        f"the erasure event at leaf {e.index} names {len(unknown)} digest(s) "
                        f"that neither record {e.request_id!r} nor its replay verdicts commit to",
                        e.index,
                    )
                )
    out.extend(_holds_kept(erased, events, record_rows))
    out.extend(
        Finding(
            "content",
            f"the hold release at leaf {idx} releases hold {hold_id!r}, which no earlier leaf "
            "placed, or which an earlier release released",
            idx,
        )
        for idx, hold_id in events.stray_releases
    )
    return out


def _holds_kept(
    erased: list[ErasureEvent],
    events: ContentEvents,
    record_rows: Callable[[Sequence[str]], list[RecordRow]],
) -> list[Finding]:
    if not erased or not events.holds:
        return []
    rows = {r.request_id: r for r in record_rows([e.request_id for e in erased])}
    out = []
    for e in erased:
        row = rows.get(e.request_id)
        for hold_id, (placed, scope) in events.holds.items():
            released = events.releases.get(hold_id)
            if placed > e.index or (released is not None and released < e.index):
                continue
            received = _as_time(row.received_at) if row is not None else None
            if row is None or received is None:  # the records check names a bad time
                covered = scope.request_id == e.request_id
            else:
                covered = scope.covers(
                    request_id=row.request_id,
                    model=row.model,
                    fingerprint_id=row.fingerprint_id,
                    pool=row.pool,
                    tier=row.tier,
                    received_at=received,
                )
            if covered:
                out.append(
                    Finding(
                        "content",
                        f"record {e.request_id!r} was erased at leaf {e.index} while legal "
                        f"hold {hold_id} (placed at leaf {placed}) covered it",
                        e.index,
                        "erasures",
                    )
                )
    return out


def _as_time(at: Micros | None) -> datetime | None:
    """A stored receive time as a datetime; None when it is none (Postgres ``infinity``)."""
    if at is None:
        return None
    try:
        return EPOCH + timedelta(microseconds=at)
    except OverflowError:
        return None
