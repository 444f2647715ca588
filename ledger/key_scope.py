"""A collector key's scope: the pools it may speak for.

An operator registers a collector key with ``pools`` (``ledger keys register --pool P``): the
registration leaf, signed by the log key, then says which pools the key's records and worker
heartbeats may name. A key registered without ``pools`` speaks for any pool (as every key did
before scopes existed). A scope turns a compromised collector key from "can sign a record or
a worker for any pool" into "can lie about its own pools only": a record naming another pool
is refused at ingest, a heartbeat naming another pool cannot register a worker there, a
replay that names no pool goes only to workers whose keys may sign for the record's pool
(:func:`may_sign_for`), and a cache lookup by pool answers only with that pool's records.
Request and worker IDs stay one namespace across pools: such a key can still take an ID
first, and another pool's record or worker with that ID is then refused (a conflict).
``ledger verify`` re-checks a bundle's record, and ``ledger audit`` every logged record and
replay verdict, against the scope the key's registration leaf holds.

One pure function per question, shared by the ledger, the audit and bundle verification
(``api/ui/static/verify.js`` mirrors :func:`out_of_scope`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ledger.errors import InvalidInput

MEMBER = "pools"
MAX_POOLS = 64
# A pool name as records and heartbeats spell it (ledger.records._NAME).
POOL_PATTERN = r"^[A-Za-z0-9._\-]{1,100}$"
_POOL = re.compile(POOL_PATTERN)
# The kinds a collector key signs that name a pool, and the member that names it.
POOL_MEMBER = {"inference_record": "pool", "worker_heartbeat": "pool"}


def check_pool_name(name: str) -> str:
    """``name`` when it can name a pool; InvalidInput ``invalid_parameters`` otherwise (a
    lookup by a name no pool can have is refused the same way on every database)."""
    if not isinstance(name, str) or not _POOL.fullmatch(name):
        raise InvalidInput(
            "a pool name is 1-100 characters of A-Z a-z 0-9 . _ -", code="invalid_parameters"
        )
    return name


def parse_pools(value: Any) -> tuple[str, ...] | None:
    """Pools asked for at registration: None (any pool) or 1-64 distinct pool names, sorted.
    InvalidInput ``invalid_pools`` otherwise."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not 1 <= len(value) <= MAX_POOLS:
        raise InvalidInput(
            f"pools must be a list of 1-{MAX_POOLS} pool names (or absent: any pool)",
            code="invalid_pools",
        )
    for name in value:
        if not isinstance(name, str) or not _POOL.fullmatch(name):
            raise InvalidInput(
                f"pool name {str(name)[:40]!r} is not 1-100 of [A-Za-z0-9._-]",
                code="invalid_pools",
            )
    if len(set(value)) != len(value):
        raise InvalidInput("pools names a pool twice", code="invalid_pools")
    return tuple(sorted(value))


def registered_pools(registration: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The scope a logged registration body holds: None when it has no ``pools`` member.
    A malformed member (never written by this ledger) scopes the key to no pool at all."""
    if MEMBER not in registration:
        return None
    value = registration[MEMBER]
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        return ()
    return tuple(value)


def out_of_scope(pools: tuple[str, ...] | None, kind: str, body: Mapping[str, Any]) -> str | None:
    """Why a document of ``kind`` with ``body``, signed by a key scoped to ``pools``, names a
    pool the key may not speak for; None when it may."""
    member = POOL_MEMBER.get(kind)
    if member is None:
        return None
    return pool_out_of_scope(pools, body.get(member), kind)


def may_sign_for(pools: tuple[str, ...] | None, pool: str) -> bool:
    """Whether a key scoped to ``pools`` (None: any) may sign for ``pool``."""
    return pools is None or pool in pools


def pool_out_of_scope(pools: tuple[str, ...] | None, pool: Any, what: str) -> str | None:
    """Why ``what`` naming ``pool`` is outside a key's ``pools``; None when it is inside."""
    if pools is None or (isinstance(pool, str) and pool in pools):
        return None
    allowed = "for no pool" if not pools else "only for " + ", ".join(repr(p) for p in pools)
    return f"{what} names pool {str(pool)[:100]!r}, but its key may sign {allowed}"
