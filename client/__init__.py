"""The ledger's HTTP API client (:class:`client.ledger_client.LedgerClient`): used by the
collectors to ship records and heartbeat, by the CLI, the demo and the tests. It imports the
core (``ledger``) and httpx (with httpcore, under it) only."""
