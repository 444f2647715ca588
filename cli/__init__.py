"""The ``ledger`` command: the composition root. Each sub-command is its own module."""
