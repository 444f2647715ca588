"""Collectors: what runs beside each vLLM worker (environment snapshot, recording proxy,
spool and shipper). Talks to the ledger only over HTTP; imports ``ledger`` but never ``api``.
"""
