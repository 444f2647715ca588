"""``ledger audit`` as a pure core: the whole log recomputed and every table compared with it.

The audit is a function of what an :class:`AuditReader` scans (``ledger/storage/
audit_reader.py`` is the one adapter; ``ledger.storage.audit.audit`` joins them), the way
``ledger.merkle`` is a function of a node reader. Nothing here opens a database. Modules:

- ``rows``: the named row type of every table, and the reader protocol;
- ``run``: the one pass over the log and the checks after it (:func:`run_audit`);
- ``rebuild``: sequence, leaf hashes, the tree rebuilt and every stored node compared;
- ``registry``: the key registry's one timeline, and the signer check as of a leaf;
- ``leaves``: per-leaf checks (form, kind, signer, index rows), run in worker processes too;
- ``derive``: the index rows a leaf implies, as ingest writes them;
- ``times``: receive times against the checkpoints around them; uncovered leaves;
- ``checkpoints``: stored and trusted checkpoints: notes, rows, roots, consistency;
- ``tables``: the key registry tables, and rows pointing past the log;
- ``report``: findings and the report.
"""

from ledger.audit.report import CHECKS, AuditReport, Finding
from ledger.audit.rows import AuditReader
from ledger.audit.run import (
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_CLOCK_TOLERANCE,
    AuditOptions,
    Progress,
    run_audit,
)

__all__ = [
    "CHECKS",
    "DEFAULT_CHECKPOINT_INTERVAL",
    "DEFAULT_CLOCK_TOLERANCE",
    "AuditOptions",
    "AuditReader",
    "AuditReport",
    "Finding",
    "Progress",
    "run_audit",
]
