"""Receive times against the checkpoints around them, and leaves no checkpoint covers.

A checkpoint note carries the time the log signed it (``ledger.checkpoint``), and the log
signs it under the append lock after the leaves it covers were appended. So for every leaf

    signed time of the last checkpoint that does not cover it - tolerance
        <= its appended_at <=
    signed time of the first checkpoint that covers it + tolerance

(``time``), where only verified notes with a time count and the tolerance allows for clocks
that differ between ledger hosts. The log signs a checkpoint only when it has grown, so after
an idle hour the first bound is an hour old; what a leaf's signed body says it was made at
closes that gap (``made_at_finding``): a leaf is appended no earlier than that, less the
tolerance (a record: less ``STARTED_SKEW``, which its collector's clock may run ahead).

A leaf that no verified checkpoint covers must be recent:
the ledger signs a checkpoint every interval while the log grows, so a leaf appended more than
the interval plus the tolerance before the audit began, and still uncovered, means the
checkpoints that covered it were deleted or never signed (``coverage``, one finding naming the
leaves); an uncovered leaf dated after the audit began is a ``time`` finding too.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from ledger.audit.derive import CERTIFICATE_KIND
from ledger.audit.report import Finding
from ledger.audit.rows import LeafChunk, Micros, as_time, micros
from ledger.clock import parse_rfc3339
from ledger.erasure import ERASURE_KIND, HOLD_KIND, RELEASE_KIND
from ledger.records import RECORD_KIND, STARTED_SKEW, started_at
from ledger.replay import VERDICT_KIND

SECOND = 1_000_000  # Micros


@dataclass(frozen=True)
class TimeRules:
    now: Micros  # when the audit began
    tolerance: Micros  # clock difference allowed between hosts
    interval: Micros  # the ledger's checkpoint interval

    @property
    def grace(self) -> Micros:
        return self.interval + self.tolerance


class TimeBounds:
    """The bounds the verified checkpoints give, applied chunk by chunk."""

    def __init__(self, timed: Iterable[tuple[int, Micros]], covered: int, rules: TimeRules):
        earliest: dict[int, Micros] = {}
        latest: dict[int, Micros] = {}
        for size, at in timed:
            earliest[size] = min(at, earliest.get(size, at))
            latest[size] = max(at, latest.get(size, at))
        self.sizes = sorted(earliest)
        self.earliest = [earliest[s] for s in self.sizes]
        self.latest = [latest[s] for s in self.sizes]
        self.covered = covered  # leaves below this are covered by a verified checkpoint
        self.rules = rules
        self.stale: list[int] = []  # uncovered leaves older than the grace period: first, last
        self.stale_count = 0

    def check(self, chunk: LeafChunk) -> list[Finding]:
        """Findings for the receive times of one chunk (sorted indexes). The times are
        compared as the chunk holds them (from its ``time_origin``): the bounds move, not
        every time, and each stretch between checkpoints is one ``min`` and one ``max``."""
        held = chunk.appended_at
        try:
            return self._check(chunk.indexes, cast(Sequence[Micros], held), chunk.time_origin, [])
        except TypeError:  # a None among them (min and max do not compare it): the slow way
            pass
        found = [
            _finding(idx, "log_entries.appended_at is not a time")
            for idx, at in zip(chunk.indexes, held, strict=True)
            if at is None and type(idx) is int
        ]
        # a row whose index is no integer has no place between checkpoints: the rebuild's
        keep = [i for i, at in enumerate(held) if at is not None and type(chunk.indexes[i]) is int]
        indexes = [chunk.indexes[i] for i in keep]
        times = [at for at in held if at is not None]
        return self._check(indexes, times, chunk.time_origin, found)

    def _check(
        self, indexes: Sequence[int], times: Sequence[Micros], origin: Micros, found: list[Finding]
    ) -> list[Finding]:
        count, tolerance, sizes = len(indexes), self.rules.tolerance, self.sizes
        pos = 0
        while pos < count:
            j = bisect_right(sizes, indexes[pos])  # sizes[j - 1] <= leaf < sizes[j]
            end = bisect_left(indexes, sizes[j], pos) if j < len(sizes) else count
            segment = times[pos:end]
            low = self.latest[j - 1] - tolerance - origin if j else None
            high = self.earliest[j] + tolerance - origin if j < len(sizes) else None
            if low is None and high is None:
                min(segment)  # no bound here: still raises TypeError on a time that is None
            if (low is not None and min(segment) < low) or (
                high is not None and max(segment) > high
            ):
                for idx, at in zip(indexes[pos:end], segment, strict=True):
                    if low is not None and at < low:
                        found.append(
                            _finding(
                                idx,
                                f"appended at {as_time(at + origin)}, before the checkpoint of "
                                f"size {sizes[j - 1]}, which does not cover it, was signed "
                                f"({as_time(self.latest[j - 1])})",
                            )
                        )
                    elif high is not None and at > high:
                        found.append(
                            _finding(
                                idx,
                                f"appended at {as_time(at + origin)}, after the checkpoint of "
                                f"size {sizes[j]}, which covers it, was signed "
                                f"({as_time(self.earliest[j])})",
                            )
                        )
            pos = end
        self._uncovered(indexes, times, origin, found)
        return found

    def _uncovered(
        self, indexes: Sequence[int], times: Sequence[Micros], origin: Micros, found: list[Finding]
    ) -> None:
        start = bisect_left(indexes, self.covered)
        if start == len(indexes):
            return
        segment = times[start:]
        stale_before = self.rules.now - self.rules.grace - origin
        future_after = self.rules.now + self.rules.tolerance - origin
        if min(segment) < stale_before:
            for idx, at in zip(indexes[start:], segment, strict=True):
                if at < stale_before:
                    if not self.stale:
                        self.stale = [idx, idx]
                    self.stale[1] = idx
                    self.stale_count += 1
        if max(segment) > future_after:
            for idx, at in zip(indexes[start:], segment, strict=True):
                if at > future_after:
                    found.append(
                        _finding(
                            idx,
                            f"appended at {as_time(at + origin)}, after the audit began "
                            f"({as_time(self.rules.now)}); no checkpoint covers it",
                        )
                    )

    def coverage(self) -> list[Finding]:
        """The one ``coverage`` finding, if any leaf is stale and uncovered."""
        if not self.stale_count:
            return []
        first, last = self.stale
        grace = self.rules.grace / SECOND
        which = (
            f"leaves {first}..{last}"
            if self.stale_count == last - first + 1
            else f"{self.stale_count} leaves between {first} and {last}"
        )
        return [
            Finding(
                "coverage",
                f"{which} are covered by no checkpoint, though appended more than {grace:g} s "
                "before the audit began (the checkpoint interval plus the clock tolerance): "
                "the checkpoints that covered them were deleted, or none was signed",
                first,
                "checkpoints",
            )
        ]


# the member of a body the log made that says when it made it
_MADE_AT = {
    VERDICT_KIND: "replayed_at",
    CERTIFICATE_KIND: "issued_at",
    ERASURE_KIND: "erased_at",
    HOLD_KIND: "placed_at",
    RELEASE_KIND: "released_at",
}
_SKEW: Micros = STARTED_SKEW // timedelta(microseconds=1)


def made_at_finding(
    kind: str, body: dict[str, Any], idx: int, at: Micros | None, tolerance: Micros
) -> Finding | None:
    """A ``time`` finding when leaf ``idx`` was appended (``at``) before its signed body says
    it was made: a receive time moved back, past what the checkpoints around it bound after
    an idle stretch. A body that does not say, or not as a time, is left to its own checks."""
    if at is None:
        return None
    if kind == RECORD_KIND:  # by its collector's clock: before ingest held off a record that
        # started more than _SKEW after it arrived, a collector whose clock ran ahead did this
        made, what, slack = started_at(body), "its request started", max(tolerance, _SKEW)
    elif kind in _MADE_AT:
        try:
            made = parse_rfc3339(body.get(_MADE_AT[kind]))
        except ValueError:
            return None
        what, slack = f"its {_MADE_AT[kind]}", tolerance
    else:
        return None
    if made is None or at >= micros(made) - slack:
        return None
    ahead = " (or, in a log an older ledger wrote, the collector's clock ran ahead)"
    return _finding(
        idx,
        f"appended at {as_time(at)}, before {what} ({as_time(micros(made))}) less "
        f"{slack / SECOND:g} s: the receive time was moved back"
        + (ahead if kind == RECORD_KIND else ""),
    )


def _finding(idx: int, message: str) -> Finding:
    return Finding("time", message, idx, "log_entries", "appended_at")
