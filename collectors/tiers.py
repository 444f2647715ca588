"""Reproducibility tiers: which requests a worker may accept at which tier (the gateway role).

- tier 0, statistical: anything.
- tier 1, request-level: the request must pin its sampling: temperature 0, or a seed.
- tier 2, strict: tier 1, and the worker's fingerprint must be batch-invariant (``kernel`` or
  ``serial``), so a replay on the same fingerprint can reproduce it bit for bit.

The OpenAI default temperature is 1, so a request that gives none is sampled. Temperatures and
seeds are read as vLLM reads them (``"0"`` is 0.0): the same value is judged the same at every
tier; one vLLM cannot read raises :class:`~collectors.vllm_request.Unsure` (the proxy sends
such a request on unchanged, and vLLM refuses it, whatever the tier).
"""

from __future__ import annotations

from typing import Any

from collectors.vllm_request import Unsure, lax_float, lax_int
from ledger.errors import Conflict, InvalidInput

TIER_HEADER = "x-reproducibility-tier"
TIERS = (0, 1, 2)


def parse_tier(header: str | None, default: int) -> int:
    if header is None or header.strip() == "":
        return default
    try:
        tier = int(header.strip())
    except ValueError:
        tier = -1
    if tier not in TIERS:
        raise InvalidInput(
            f"X-Reproducibility-Tier must be 0, 1 or 2, not {header!r}", code="invalid_tier"
        )
    return tier


def _temperature(body: dict[str, Any]) -> float:
    value = lax_float(body.get("temperature"), "temperature")
    return 1.0 if value is None else value


def _deterministic(body: dict[str, Any]) -> bool | None:
    """Whether vLLM samples ``body`` deterministically (temperature 0, or a seed); None when
    the collector cannot read the values that decide it as vLLM reads them."""
    try:
        greedy: bool | None = _temperature(body) == 0.0
    except Unsure:
        greedy = None
    try:
        seeded: bool | None = lax_int(body.get("seed"), "seed") not in (None, -1)  # -1: none
    except Unsure:
        seeded = None
    if greedy or seeded:
        return True
    return None if greedy is None or seeded is None else False


def _missing(tier: int, deterministic: bool | None, batch_invariance: str) -> list[str]:
    missing: list[str] = []
    if tier == 0:
        return missing
    if not deterministic:
        missing.append("deterministic sampling (temperature 0, or a seed)")
    if tier == 2 and batch_invariance not in ("kernel", "serial"):
        missing.append(
            f"a batch-invariant worker (this worker's fingerprint has batch_invariance "
            f"{batch_invariance!r}; tier 2 needs 'kernel' or 'serial')"
        )
    return missing


def missing_conditions(tier: int, body: dict[str, Any], batch_invariance: str) -> list[str]:
    """What ``body`` on a worker with ``batch_invariance`` lacks for ``tier`` (empty: accepted).

    Raises :class:`Unsure` when it depends on values the collector cannot read as vLLM does.
    """
    if tier == 0:
        return []
    deterministic = _deterministic(body)
    if deterministic is None:
        raise Unsure("the request's temperature or seed is not one the collector reads")
    return _missing(tier, deterministic, batch_invariance)


def _refusal(tier: int, missing: list[str]) -> Conflict:
    return Conflict(
        f"tier {tier} refused: needs " + "; and ".join(missing),
        code="tier_refused",
        details={"tier": tier, "missing": missing},
    )


def check_tier(tier: int, body: dict[str, Any], batch_invariance: str) -> None:
    """Raise Conflict (409) naming every missing condition when ``tier`` cannot be honoured."""
    missing = missing_conditions(tier, body, batch_invariance)
    if missing:
        raise _refusal(tier, missing)


def refusal_if_answered(tier: int, body: object, batch_invariance: str) -> Conflict | None:
    """For a request the proxy sends on unchanged: the refusal to answer in place of a 2xx
    from vLLM when ``tier`` would not have allowed it (vLLM's refusals pass as they are)."""
    deterministic = _deterministic(body) if isinstance(body, dict) else None
    missing = _missing(tier, deterministic, batch_invariance)
    return _refusal(tier, missing) if missing else None
