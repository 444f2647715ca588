"""The collector's failure counters label an error code from whatever answered at the ledger's
URL: a bounded set of values, whatever that answer holds."""

from __future__ import annotations

from prometheus_client import generate_latest

from collectors.metrics import MAX_CODES, CollectorMetrics


def test_failure_codes_from_the_ledger_are_bounded() -> None:
    metrics = CollectorMetrics()
    for code in ("ledger_unreachable", "ledger_unreachable", "http_502"):
        metrics.ship_failures.labels(metrics.code_label(code)).inc()
    for hostile in ("<html>", "A" * 500, "x y", ""):
        metrics.ship_failures.labels(metrics.code_label(hostile)).inc()
    for i in range(MAX_CODES * 3):
        metrics.heartbeat_failures.labels(metrics.code_label(f"code_{i}")).inc()
    text = generate_latest(metrics.registry).decode()
    ship = [line for line in text.splitlines() if line.startswith("collector_ship_failures_total{")]
    assert sorted(ship) == [
        'collector_ship_failures_total{code="http_502"} 1.0',
        'collector_ship_failures_total{code="ledger_unreachable"} 2.0',
        'collector_ship_failures_total{code="other"} 4.0',
    ]
    beats = [
        line for line in text.splitlines() if line.startswith("collector_heartbeat_failures_total{")
    ]
    assert len(beats) <= MAX_CODES + 1 and any('code="other"' in line for line in beats)
