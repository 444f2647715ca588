"""Ships spooled records to the ledger in batches, with retry and backoff, never losing one.

A batch is acknowledged as a whole (the ledger's ingest is atomic and idempotent: a record it
already holds comes back as ``duplicate``), then removed from the spool. Batches hold at most
``batch`` records and ``max_bytes`` of envelopes; a batch the ledger finds too large is cut to
the limit its answer names (halved when it names none), down to one record. When the ledger
refuses one item for good (invalid, too large on its own, or a different record under the same
request ID), that item goes to the spool's dead letters with the reason and the rest is
retried at once. A record under a fingerprint the ledger does not know (one queued as this
batch formed, when the engine restarted) waits for the fingerprint to be registered again.
Anything else (the ledger down, overloaded, too slow, the network, a credential problem, an
unexpected error) keeps every record and retries with exponential backoff and jitter. Too slow:
the collector's client gives each request :data:`DEADLINE` seconds in all (``--ship-deadline``),
however slowly the ledger or a proxy in front of it answers, then abandons it
(``ledger_too_slow``), and the next batches are half as large (a link that cannot carry a
batch within the deadline still carries a smaller one), growing back every 10 minutes; a
batch the ledger took before its answer was cut off is answered ``duplicate`` when sent again,
and acknowledged then.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from client.ledger_client import LedgerClient
from collectors.spool import REQUEST_ID_RETENTION, Spool, Spooled
from ledger.errors import Conflict, InvalidInput, LedgerError, Pushback, TooLarge
from ledger.record_v2 import as_wire_item

logger = logging.getLogger("ledger.collector.shipper")
BATCH = 200
# Bytes of envelopes per batch: well under the ledger's default body limit (32 MiB), so that
# long-context records do not make every batch too large.
MAX_BYTES = 8 * 1024 * 1024
_FRAME = len(b'{"records":[]}')  # a batch body's bytes besides its items and commas
BACKOFF_START = 0.2
BACKOFF_MAX = 15.0
# Refusals about the collector's key rather than the record: retried (with backoff) until the
# ledger knows the key again, never set aside record by record.
_KEY_LEVEL = frozenset({"unknown_key", "key_role_not_allowed"})
# Wait this long for more records before posting a partial batch: records are durable in the
# spool meanwhile, and each ledger round trip costs both sides a few milliseconds of CPU
# whatever its size (docs/PERFORMANCE.md, collector overhead).
LINGER = 0.25
# Seconds a request to the ledger may take in all, however slowly the ledger (or a proxy in
# front of it) answers: four times the client's timeout for one read (30 s). httpx's timeouts
# bound each read and write, so an answer that trickles in a byte at a time never trips them.
DEADLINE = 120.0
# Seconds of batches taken at a bound ledger_too_slow set before it is doubled: each try of a
# batch the link cannot carry costs a whole deadline, so growth is tried seldom.
SLOW_RECOVERY = 600.0
FORGET_EVERY = 3600.0


class Shipper:
    def __init__(
        self,
        spool: Spool,
        client: LedgerClient,
        *,
        batch: int = BATCH,
        max_bytes: int = MAX_BYTES,
        linger: float = LINGER,
        on_shipped: Callable[[int], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        content_retention_days: int | None = None,
        on_expired: Callable[[int, int], None] | None = None,
    ) -> None:
        self.spool = spool
        self.client = client
        self.batch = batch
        self.max_bytes = max_bytes
        self.linger = linger
        self.on_shipped = on_shipped
        self.on_failure = on_failure
        self.content_retention_days = content_retention_days
        self.on_expired = on_expired
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shipper", daemon=True)
        self.backoff = 0.0
        # Bytes per batch while the link cannot carry a larger one within the client's
        # deadline (None: no such bound): halved at each ledger_too_slow, doubled back once
        # batches have been taken for SLOW_RECOVERY seconds since it last changed.
        self.slow_cap: int | None = None
        self._slow_since = 0.0
        self._next_forget = 0.0

    def start(self) -> Shipper:
        self._thread.start()
        return self

    def stop(self, drain_timeout: float = 0.0) -> None:
        """Stop after at most ``drain_timeout`` seconds of trying to empty the spool."""
        if drain_timeout > 0:
            deadline = threading.Event()
            timer = threading.Timer(drain_timeout, deadline.set)
            timer.start()
            while self.spool.pending() and not deadline.is_set() and self._thread.is_alive():
                deadline.wait(0.05)
            timer.cancel()
        self._stop.set()
        self.spool.added.set()
        self._thread.join(timeout=30)

    def _register_fingerprints(self) -> bool:
        """Register fingerprints the ledger lacks; False (after backing off) if it failed."""
        for fingerprint_id, envelope in self.spool.unregistered_fingerprints():
            try:
                self.client.post_fingerprint(envelope)
            except LedgerError as exc:
                self._retry([], exc, what=f"registering fingerprint {fingerprint_id}")
                return False
            self.spool.fingerprint_registered(fingerprint_id)
            logger.info("fingerprint %s registered", fingerprint_id)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as exc:  # the shipper outlives any one failure, or records pile up
                logger.exception("shipping failed unexpectedly")
                self._retry([], LedgerError(f"unexpected error: {exc!r}", code="shipper_error"))

    def _step(self) -> None:
        self.spool.checkpoint()
        if time.monotonic() >= self._next_forget:
            # The spool remembers used request IDs for a while: forget the oldest (hourly).
            self._next_forget = time.monotonic() + FORGET_EVERY
            self.spool.forget_request_ids(time.time() - REQUEST_ID_RETENTION)
            if self.content_retention_days is not None:
                self._expire(self.content_retention_days)
        if not self._register_fingerprints():
            return
        items, full = self._oldest()
        if not items:
            self.spool.added.wait(1.0)
            self.spool.added.clear()
            return
        if not full and self.linger > 0:
            # Let concurrent requests join the batch: one ledger round trip for many.
            self._stop.wait(self.linger)
            items, _ = self._oldest()
        self._send(items)

    def _expire(self, days: int) -> None:
        """The spool keeps no content past the retention: pending records and dead letters
        older than it are deleted (counted and logged: the ledger never sees them)."""
        pending, dead = self.spool.expire_content(time.time() - days * 86400.0)
        if pending or dead:
            logger.warning(
                "retention: deleted %d pending record(s) and %d dead letter(s) spooled more "
                "than %d days ago",
                pending,
                dead,
                days,
            )
        if self.on_expired is not None:
            self.on_expired(pending, dead)

    def _oldest(self) -> tuple[list[Spooled], bool]:
        """The next batch (at least one record, however large), and whether it is full."""
        items = self.spool.oldest(self.batch)
        fitting = _fit(items, min(self.max_bytes, self.slow_cap or self.max_bytes))
        return fitting, len(fitting) < len(items) or len(items) >= self.batch

    def _send(self, items: list[Spooled]) -> None:
        """Post one batch; acknowledge it, set aside what the ledger refuses for good, or wait."""
        try:
            self.client.post_canonical([i.envelope for i in items])
        except TooLarge as exc:
            # Over one of the ledger's limits (bytes per body, or records per batch): keep
            # under the limit it names from now on, and send what fits (or, with no limit
            # named, the first half); the rest follows in the next batches. A record over the
            # body limit on its own cannot get in: it is set aside.
            limit = exc.details.get("limit")
            if isinstance(limit, int) and limit > 0:
                if exc.code == "batch_too_large":
                    self.batch = min(self.batch, limit)
                elif limit > _FRAME:
                    self.max_bytes = min(self.max_bytes, limit - _FRAME)
            if len(items) == 1:
                self._dead_letter(items[0], exc)
                return
            fitting = _fit(items[: self.batch], self.max_bytes)
            self._send(fitting if len(fitting) < len(items) else items[: len(items) // 2])
        except (InvalidInput, Conflict) as exc:
            index = exc.details.get("item")
            if exc.code == "unknown_fingerprint" and self.spool.reregister_fingerprint(
                str(exc.details.get("fingerprint_id"))
            ):
                # Queued as this batch formed (the engine restarted), or lost by the ledger:
                # register it again before the next attempt. (A fingerprint this collector
                # never had cannot be: that record is set aside below.)
                self._retry(items, exc)
            elif exc.code in _KEY_LEVEL:
                # About the signing key, not the record: registering the key (or restoring
                # the ledger's log) lets every record in; setting them aside would not.
                self._retry(items, exc)
            elif isinstance(index, int) and 0 <= index < len(items):
                self._dead_letter(items[index], exc)
            else:
                self._retry(items, exc)
        except LedgerError as exc:
            if exc.code == "ledger_too_slow" and len(items) > 1:
                # A link too slow for this batch within the deadline would fail it for good:
                # send half as much next time, as often as it takes (one record at least).
                self.slow_cap = max(_batch_bytes(items) // 2, _FRAME + 1)
                self._slow_since = time.monotonic()
            self._retry(items, exc)
        else:
            self.spool.ack([i.seq for i in items])
            if self.slow_cap is not None and time.monotonic() - self._slow_since >= SLOW_RECOVERY:
                grown = self.slow_cap * 2
                self.slow_cap = None if grown >= self.max_bytes else grown
                self._slow_since = time.monotonic()
            self.backoff = 0.0
            if self.on_shipped is not None:
                self.on_shipped(len(items))

    def _dead_letter(self, item: Spooled, exc: LedgerError) -> None:
        reason = f"{exc.code}: {exc.message}"
        logger.error("ledger refused record %s for good: %s", item.request_id, reason)
        self.spool.dead_letter(item, reason)
        self._failed(exc.code)

    def _failed(self, code: str) -> None:
        if self.on_failure is not None:
            self.on_failure(code)

    def _retry(self, items: list[Spooled], exc: LedgerError, what: str = "") -> None:
        self._failed(exc.code)
        if items:
            self.spool.failed([i.seq for i in items], f"{exc.code}: {exc.message}")
        self.backoff = min(BACKOFF_MAX, max(BACKOFF_START, self.backoff * 2))
        delay = self.backoff
        if isinstance(exc, Pushback):  # the server's Retry-After, never past BACKOFF_MAX: a
            # maintenance page's "86400" must not hold every record for a day
            delay = min(BACKOFF_MAX, max(exc.retry_after, self.backoff))
        logger.warning(
            "%s failed (%s: %s); retrying in %.1f s",
            what or f"shipping {len(items)} records",
            exc.code,
            exc.message,
            delay,
        )
        self._stop.wait(delay * (0.8 + 0.4 * random.random()))


def _batch_bytes(items: list[Spooled]) -> int:
    return _FRAME + sum(len(as_wire_item(item.envelope)) + 1 for item in items)


def _fit(items: list[Spooled], max_bytes: int) -> list[Spooled]:
    """The longest prefix of ``items`` whose batch body is within ``max_bytes`` (at least one)."""
    size = _FRAME
    for n, item in enumerate(items):
        size += len(as_wire_item(item.envelope)) + 1
        if size > max_bytes and n > 0:
            return items[:n]
    return items
