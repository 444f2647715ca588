"""Ships spooled records to the ledger in batches, with retry and backoff, never losing one.

A batch is acknowledged as a whole (the ledger's ingest is atomic and idempotent: a record it
already holds comes back as ``duplicate``), then removed from the spool. When the ledger refuses
one item for good (invalid, or a different record under the same request ID), that item goes to
the spool's dead letters with the reason and the rest is retried at once. Anything else (the
ledger down, overloaded, the network, a credential problem) keeps every record and retries
with exponential backoff and jitter.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from collectors.ledger_client import LedgerClient
from collectors.spool import Spool, Spooled
from ledger.errors import Conflict, InvalidInput, LedgerError, Pushback

logger = logging.getLogger("ledger.collector.shipper")
BATCH = 200
BACKOFF_START = 0.2
BACKOFF_MAX = 15.0
# Wait this long for more records before posting a partial batch: records are durable in the
# spool meanwhile, and each ledger round trip costs both sides a few milliseconds of CPU
# whatever its size (docs/PERFORMANCE.md, collector overhead).
LINGER = 0.25


class Shipper:
    def __init__(
        self,
        spool: Spool,
        client: LedgerClient,
        *,
        batch: int = BATCH,
        linger: float = LINGER,
        on_shipped: Callable[[int], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.spool = spool
        self.client = client
        self.batch = batch
        self.linger = linger
        self.on_shipped = on_shipped
        self.on_failure = on_failure
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shipper", daemon=True)
        self.backoff = 0.0

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
            if not self._register_fingerprints():
                continue
            items = self.spool.oldest(self.batch)
            if not items:
                self.spool.added.wait(1.0)
                self.spool.added.clear()
                continue
            if len(items) < self.batch and self.linger > 0:
                # Let concurrent requests join the batch: one ledger round trip for many.
                self._stop.wait(self.linger)
                items = self.spool.oldest(self.batch)
            try:
                self.client.post_canonical([i.envelope for i in items])
            except (InvalidInput, Conflict) as exc:
                index = exc.details.get("item")
                if isinstance(index, int) and 0 <= index < len(items):
                    bad = items[index]
                    reason = f"{exc.code}: {exc.message}"
                    logger.error("ledger refused record %s for good: %s", bad.request_id, reason)
                    self.spool.dead_letter(bad, reason)
                    self._failed(exc.code)
                    continue
                self._retry(items, exc)
            except LedgerError as exc:
                self._retry(items, exc)
            else:
                self.spool.ack([i.seq for i in items])
                self.backoff = 0.0
                if self.on_shipped is not None:
                    self.on_shipped(len(items))

    def _failed(self, code: str) -> None:
        if self.on_failure is not None:
            self.on_failure(code)

    def _retry(self, items: list[Spooled], exc: LedgerError, what: str = "") -> None:
        self._failed(exc.code)
        if items:
            self.spool.failed([i.seq for i in items], f"{exc.code}: {exc.message}")
        self.backoff = min(BACKOFF_MAX, max(BACKOFF_START, self.backoff * 2))
        delay = max(exc.retry_after, self.backoff) if isinstance(exc, Pushback) else self.backoff
        logger.warning(
            "%s failed (%s: %s); retrying in %.1f s",
            what or f"shipping {len(items)} records",
            exc.code,
            exc.message,
            delay,
        )
        self._stop.wait(delay * (0.8 + 0.4 * random.random()))
