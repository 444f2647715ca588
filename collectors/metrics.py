"""The collector's Prometheus metrics, in a registry of its own (one per collector app)."""

from __future__ import annotations

import re
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# Error codes come from whatever answers at the ledger's URL (a proxy may stand there): a
# label takes a code of the ledger's form, and at most this many different ones ("other").
_CODE = re.compile(r"[a-z][a-z0-9_]{0,47}")
MAX_CODES = 64


class CollectorMetrics:
    def __init__(self) -> None:
        self._codes: set[str] = set()
        self._codes_lock = threading.Lock()
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "collector_requests",
            "Requests by endpoint and outcome",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.engine_errors = Counter(
            "collector_engine_errors", "Engine answers with an error status", ["status"], registry=r
        )
        self.refusals = Counter(
            "collector_refusals", "Requests refused by the collector", ["code"], registry=r
        )
        self.unrecordable = Counter(
            "collector_unrecordable",
            "Answers the client got from vLLM without a record: requests the collector could "
            "not read as vLLM would, sent on unchanged (by reason), or answers no record can "
            "hold (record_invalid)",
            ["reason"],
            registry=r,
        )
        self.spooled = Counter(
            "collector_records_spooled", "Records written to the spool", registry=r
        )
        self.shipped = Counter(
            "collector_records_shipped", "Records acknowledged by the ledger", registry=r
        )
        self.ship_failures = Counter(
            "collector_ship_failures", "Failed shipping attempts", ["code"], registry=r
        )
        self.retention_deleted = Counter(
            "collector_retention_deleted",
            "Spooled records deleted past the content retention, by where (pending, dead_letter)",
            ["where"],
            registry=r,
        )
        self.pending = Gauge("collector_records_pending", "Records in the spool", registry=r)
        self.dead_letters = Gauge(
            "collector_records_dead_lettered", "Records the ledger refused for good", registry=r
        )
        self.added_latency = Histogram(
            "collector_added_latency_seconds",
            "Time the collector adds to a request (parse, sign, spool)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.snapshot_failures = Counter(
            "collector_snapshot_failures",
            "Re-snapshots that failed (requests are refused until one holds)",
            registry=r,
        )
        self.fingerprint_changes = Counter(
            "collector_fingerprint_changes", "Re-snapshots that changed the fingerprint", registry=r
        )
        self.replays = Counter(
            "collector_replays", "Ledger replay orders run (not recorded as traffic)", registry=r
        )
        self.heartbeat_failures = Counter(
            "collector_heartbeat_failures", "Failed worker registrations", ["code"], registry=r
        )
        self.system_fingerprint_mismatches = Counter(
            "collector_system_fingerprint_mismatches",
            "Responses whose system_fingerprint differs from the one expected of the engine (the "
            "ledger fingerprint ID under --fingerprint-mode custom, else what the engine "
            "answered when it was fingerprinted): the engine changed since",
            registry=r,
        )
        self.render_mismatches = Counter(
            "collector_token_render_mismatches",
            "Sampled tokens whose string, rendered from its ID, differed from vLLM's own (the "
            "client got vLLM's; top-k alternatives of such a model may differ too)",
            registry=r,
        )

    def code_label(self, code: str) -> str:
        """``code`` as a label value: itself when it has the ledger's form and is one of the
        first :data:`MAX_CODES` seen, else ``other``."""
        if not isinstance(code, str) or not _CODE.fullmatch(code):
            return "other"
        with self._codes_lock:
            if code in self._codes:
                return code
            if len(self._codes) >= MAX_CODES:
                return "other"
            self._codes.add(code)
            return code
