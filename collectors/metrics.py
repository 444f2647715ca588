"""The collector's Prometheus metrics, in a registry of its own (one per collector app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class CollectorMetrics:
    def __init__(self) -> None:
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
