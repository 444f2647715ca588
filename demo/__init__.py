"""The demo's scenarios, shared by ``ledger demo`` and ``ledger gpu-check``: an embedded
ledger, vLLM pools with recording collectors (:mod:`demo.engine`), mixed traffic, replays,
certification and cache lookups (:mod:`demo.traffic`), the walkthrough without an engine and
the compliance officer's steps (:mod:`demo.scenario`). They report progress on the
``ledger.demo`` logger and raise :class:`demo.errors.CheckFailed` when something the demo
shows does not hold; ``cli`` parses options and prints. No CLI framework is imported here."""
