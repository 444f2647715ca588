"""Worker heartbeats (schema version 1): a collector's signed word on where its worker is.

A collector registers its worker, and keeps it live, by posting a **worker heartbeat**
envelope signed by its collector key (``POST /v1/workers``):

    kind "worker_heartbeat", signed by the collector key
    body {"schema_version": 1, "worker_id", "pool", "url", "fingerprint_id", "issued_at",
          "spool_pending"?}

The signature binds the worker to the key: a ``worker_id`` belongs to the first key that
registered it, and a replay output only counts when that key signed it. ``issued_at``
(RFC 3339, UTC) must lie within :data:`MAX_SKEW` of the ledger's clock and be later than the
worker's last accepted heartbeat, so a captured heartbeat can neither be replayed nor roll a
URL back. ``spool_pending``, optional, is how many records the collector's spool holds that
the ledger has not acknowledged yet (a non-negative integer; the ledger's
``ledger_collector_spool_pending`` gauge). The body claims no batch invariance: the ledger
derives it from the fingerprint (:func:`batch_invariance`), whose body the collector signed
when it registered it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ledger.clock import rfc3339
from ledger.errors import InvalidInput
from ledger.worker_url import parse_worker_url

HEARTBEAT_KIND = "worker_heartbeat"
SCHEMA_VERSION = 1
MAX_SKEW = timedelta(seconds=60)
INVARIANCE_MODES = ("kernel", "serial", "none")
FIELDS = ("schema_version", "worker_id", "pool", "url", "fingerprint_id", "issued_at")
OPTIONAL = ("spool_pending",)
MAX_PENDING = 2**53
_NAME = re.compile(r"^[A-Za-z0-9._\-]{1,100}$")
_FINGERPRINT_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z$")


@dataclass(frozen=True)
class Heartbeat:
    """A checked heartbeat body."""

    worker_id: str
    pool: str
    url: str
    fingerprint_id: str
    issued_at: datetime
    spool_pending: int | None = None


def _fail(message: str, code: str = "schema_violation") -> InvalidInput:
    return InvalidInput(message, code=code)


format_time = rfc3339


def build_heartbeat(
    *,
    worker_id: str,
    pool: str,
    url: str,
    fingerprint_id: str,
    issued_at: datetime | None = None,
    spool_pending: int | None = None,
) -> dict[str, Any]:
    """The body a collector signs (``issued_at`` now unless given)."""
    pending = {} if spool_pending is None else {"spool_pending": spool_pending}
    return {
        **pending,
        "schema_version": SCHEMA_VERSION,
        "worker_id": worker_id,
        "pool": pool,
        "url": url,
        "fingerprint_id": fingerprint_id,
        "issued_at": format_time(issued_at or datetime.now(UTC)),
    }


def check_name(what: str, value: str, code: str = "schema_violation") -> None:
    """A worker ID or pool name as a heartbeat carries it; InvalidInput naming ``what``."""
    if not _NAME.fullmatch(value):
        raise _fail(f"{what} must be 1-100 of [A-Za-z0-9._-]", code)


def check_heartbeat(body: Any, now: datetime) -> Heartbeat:
    """Validate a heartbeat body (shape, names, URL syntax, time window); raise InvalidInput.

    The URL's addresses are checked apart (:func:`ledger.worker_url.check_worker_url`): that
    needs a resolver and the configured networks."""
    if not isinstance(body, dict):
        raise _fail("a worker heartbeat body must be a JSON object")
    missing = [f for f in FIELDS if f not in body]
    if missing:
        raise _fail(f"worker heartbeat lacks {missing}")
    extra = sorted(set(body) - set(FIELDS) - set(OPTIONAL))
    if extra:
        raise _fail(f"worker heartbeat has unknown members {extra} (it claims no invariance)")
    version = body["schema_version"]
    if type(version) is not int or version != SCHEMA_VERSION:  # true is not 1
        raise _fail(
            f"unsupported worker heartbeat schema_version {version!r}; this ledger reads "
            f"{SCHEMA_VERSION}",
            code="unsupported_schema_version",
        )
    for name in FIELDS[1:]:
        if not isinstance(body[name], str):
            raise _fail(f"worker heartbeat {name} must be a string")
    for name in ("worker_id", "pool"):
        check_name(name, body[name])
    if not _FINGERPRINT_ID.fullmatch(body["fingerprint_id"]):
        raise _fail("fingerprint_id must be sha256:<64 hex>")
    parse_worker_url(body["url"])
    issued = parse_time(body["issued_at"])
    age = now - issued
    if not -MAX_SKEW <= age <= MAX_SKEW:
        raise _fail(
            f"the heartbeat was issued {age.total_seconds():.0f} s before the ledger's clock; "
            f"at most {MAX_SKEW.total_seconds():.0f} s either way (is the collector's clock "
            "right?)",
            code="stale_heartbeat",
        )
    pending = body.get("spool_pending")
    if pending is not None and (type(pending) is not int or not 0 <= pending <= MAX_PENDING):
        raise _fail("spool_pending must be a non-negative integer")  # true is not 1
    return Heartbeat(
        body["worker_id"], body["pool"], body["url"], body["fingerprint_id"], issued, pending
    )


def parse_time(value: str) -> datetime:
    if not _TIME.fullmatch(value):
        raise _fail(f"issued_at {value[:40]!r} is not an RFC 3339 UTC time (…Z)")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise _fail(f"issued_at {value!r} is not a valid time") from exc


def batch_invariance(fingerprint_body: dict[str, Any]) -> str:
    """The batch invariance a fingerprint body implies, derived from its engine section's
    signed flags and environment by :func:`derive_invariance` (the rule the collector applies
    when it writes the section's ``batch_invariance``, which is its claim and not read here:
    a section saying ``serial`` beside ``max_num_seqs: 256`` is ``none``). No engine section,
    or one in another shape, is ``none``."""
    engine = fingerprint_body.get("engine")
    if not isinstance(engine, dict):
        return "none"
    env = engine.get("env")
    return derive_invariance(engine, env if isinstance(env, dict) else None)


def derive_invariance(flags: Mapping[str, Any], env: Mapping[str, Any] | None) -> str:
    """``kernel`` when the engine's ``VLLM_BATCH_INVARIANT`` is a non-zero integer (as vLLM
    reads it: ``bool(int(value))``); ``serial`` when ``max_num_seqs`` is 1 and prefix caching
    and chunked prefill are both off (every request runs alone); ``none`` otherwise, flags
    unknown included (docs/FINGERPRINT.md)."""
    if env is not None and env_flag_on(env.get("VLLM_BATCH_INVARIANT")):
        return "kernel"
    seqs = flags.get("max_num_seqs")
    if (
        type(seqs) is int  # true is not 1
        and seqs == 1
        and flags.get("enable_prefix_caching") is False
        and flags.get("enable_chunked_prefill") is False
    ):
        return "serial"
    return "none"


def env_flag_on(value: Any) -> bool:
    """vLLM's reading of a 0/1 variable: ``bool(int(value))`` (" 1" and "2" are on; a value
    that is no integer stops vLLM from starting, so it is not on here)."""
    if not isinstance(value, str):
        return False
    try:
        return int(value) != 0
    except ValueError:
        return False
