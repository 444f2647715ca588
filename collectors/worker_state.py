"""What one collector knows about its worker while it serves: identity, keys, spool, counters.

One :class:`WorkerState` per proxy, shared by its request handlers (``collectors/proxy.py``,
``collectors/streaming.py``), its replay endpoint (``collectors/replay.py``) and the
``Collector`` that owns it (which swaps ``fingerprint_id`` when the engine restarts under a new
environment). It imports nothing of the proxy, so every handler module can take it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from collectors.metrics import CollectorMetrics
from collectors.spool import Spool
from collectors.tokens import TokenRenderer
from ledger.errors import Pushback
from ledger.signing import SigningKey


def unsure() -> Pushback:
    """The answer while ``WorkerState.fingerprint_unsure``: the reason (file names, an
    exception) stays in the collector's log, not in an answer to whoever asks."""
    return Pushback(
        "the engine restarted and is not fingerprinted yet (the collector's log says why): "
        "nothing is recorded, so nothing is answered, until it is",
        code="fingerprint_unsure",
        retry_after=2.0,
    )


@dataclass
class WorkerState:
    """What every record of this worker carries; the fingerprint changes on engine restarts."""

    engine_url: str
    worker_id: str
    pool: str
    default_tier: int
    key: SigningKey
    spool: Spool
    fingerprint_id: str
    batch_invariance: str
    # Why the engine's environment is unknown since it restarted (a re-snapshot failed; the
    # watcher retries it): requests that would be recorded are refused meanwhile. None: known.
    fingerprint_unsure: str | None = None
    # What the engine's responses should carry as system_fingerprint (None: not checked).
    expected_system_fingerprint: str | None = None
    # The ledger's log key: replay orders must be signed by it (None: no replays taken).
    log_public_key: Ed25519PublicKey | None = None
    seen_orders: dict[str, float] = field(default_factory=dict)  # replay IDs already run
    metrics: CollectorMetrics = field(default_factory=CollectorMetrics)
    # Renders tokens as vLLM does, so records can keep top-k alternatives' IDs (None: they
    # are not recorded; the model's tokenizer is not one it reproduces exactly).
    renderer: TokenRenderer | None = None
    # Records of clients that left mid-stream, being signed and committed on the proxy's loop
    # (``collectors/recording.py``); the proxy waits for them before it stops.
    leaving: set[asyncio.Task[None]] = field(default_factory=set)
    # Request IDs of exchanges under way (touched only on the proxy's event loop): the spool
    # knows an ID once its record is in, so two requests sent at once under one ID are told
    # apart here; and with no other exchange, a record is committed on the loop.
    in_flight: set[str] = field(default_factory=set)
