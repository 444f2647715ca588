"""What stops a demo: a check that did not hold (a negative result), or trouble."""

from __future__ import annotations

from ledger.errors import LedgerError


class CheckFailed(LedgerError):
    """Something the demo shows did not hold (a record read back differently, a strict replay
    that was not bitwise, an audit finding): the CLI exits 1."""

    code = "demo_check_failed"


class DemoTrouble(LedgerError):
    """The demo could not run a step (an engine that did not start, a collector that did not
    register, an answer it did not expect): the CLI exits 2."""

    code = "demo_trouble"
