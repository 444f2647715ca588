"""Replay documents (schema version 1): the order, the worker's output, the verdict.

The ledger sends a worker's collector a **replay order** signed by the log key: the recorded
engine request, unchanged, to run once and not record as traffic. The collector answers with a
**replay output** signed by its collector key: the prompt and output token IDs and float32
logprobs the engine produced, packed as in records. The ledger compares (``ledger.compare``)
and appends a **replay verdict**, signed by the log key, that embeds the signed output, so the
verdict is evidence on its own.

    order   {"schema_version", "replay_id", "request_id", "worker_id", "endpoint",
             "request_raw": "<base64 of the exact engine request bytes>", "issued_at"}
    output  {"schema_version", "replay_id", "request_id", "worker_id", "fingerprint_id",
             "prompt_token_ids", "choices": [<record choice> + optional "margins"],
             "system_fingerprint", "timings": {"started_at", "total_ns"}}
    verdict {"schema_version", "replay_id", "request_id",
             "record": {"log_index", "content_hash", "fingerprint_id"},
             "pool", "worker_id", "worker_key_id", "worker_fingerprint_id", "forced",
             "verdict", "reason", "comparison", "fingerprint_diff", "output", "replayed_at"}

A verdict about a schema v2 record holds ``"output": null`` and ``"output_digest"``: the digest
of a salted ``replay_output`` disclosure (``ledger.disclosures``) of the signed output, kept
apart from the log with the record's content and erased with it.

``worker_key_id`` is the collector key the worker is bound to (the key that registered it):
the embedded output, when there is one, is signed by it, or there is no verdict but ``error``.

``margins`` (float32, one per output position) is the top-1 minus top-2 logprob the engine
reported there, present when the request asked for at least two alternatives.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ledger.clock import utc_now
from ledger.compare import VERDICTS, Generation, Output
from ledger.errors import InvalidInput
from ledger.packing import check_logprobs, decode_packed, pack_float32, unpack_float32, unpack_int32
from ledger.records import ENDPOINTS, Choice, build_record_body, check_choice

ORDER_KIND = "replay_order"
OUTPUT_KIND = "replay_output"
VERDICT_KIND = "replay_verdict"
SCHEMA_VERSION = 1
ORDER_MAX_AGE = timedelta(minutes=5)
_REPLAY_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,40}$")


def _fail(message: str) -> InvalidInput:
    return InvalidInput(message, code="invalid_replay_document")


def _require(body: Any, fields: Sequence[str], what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _fail(f"a {what} must be a JSON object")
    missing = [f for f in fields if f not in body]
    if missing:
        raise _fail(f"{what} lacks {missing}")
    version = body.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:  # true and 1.0 are not 1
        raise _fail(f"unsupported {what} schema_version {version!r}")
    return body


_now = utc_now


# ---- order -------------------------------------------------------------------------------

_ORDER_FIELDS = (
    "schema_version",
    "replay_id",
    "request_id",
    "worker_id",
    "endpoint",
    "request_raw",
    "issued_at",
)


def build_order(
    *, replay_id: str, request_id: str, worker_id: str, endpoint: str, request_raw: str
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "replay_id": replay_id,
        "request_id": request_id,
        "worker_id": worker_id,
        "endpoint": endpoint,
        "request_raw": request_raw,
        "issued_at": _now(),
    }


def check_order(body: Any, worker_id: str, now: datetime | None = None) -> dict[str, Any]:
    """Validate an order addressed to ``worker_id`` and issued within ORDER_MAX_AGE."""
    order = _require(body, _ORDER_FIELDS, "replay order")
    if order["endpoint"] not in ENDPOINTS:
        raise _fail(f"cannot replay endpoint {order['endpoint']!r}")
    if order["worker_id"] != worker_id:
        raise _fail(f"this order is for worker {order['worker_id']!r}, not {worker_id!r}")
    stamp = order["issued_at"]
    try:
        if not isinstance(stamp, str):
            raise ValueError("not a string")
        issued = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError as exc:
        raise _fail("issued_at is not an RFC 3339 time") from exc
    if issued.tzinfo is None:  # a naive time cannot be compared with the clock
        raise _fail("issued_at must carry a time zone (Z)")
    age = (now or datetime.now(UTC)) - issued
    if not -ORDER_MAX_AGE < age < ORDER_MAX_AGE:
        raise _fail(f"the order was issued {age.total_seconds():.0f} s ago: too old or early")
    return order


# ---- output ------------------------------------------------------------------------------

_OUTPUT_FIELDS = (
    "schema_version",
    "replay_id",
    "request_id",
    "worker_id",
    "fingerprint_id",
    "prompt_token_ids",
    "choices",
    "system_fingerprint",
    "timings",
)


@dataclass(frozen=True)
class ReplayedChoice:
    choice: Choice
    margins: Sequence[float] | None = None


def build_output(
    *,
    order: dict[str, Any],
    fingerprint_id: str,
    prompt_token_ids: Sequence[int],
    choices: Sequence[ReplayedChoice],
    system_fingerprint: str | None,
    started_at: str,
    total_ns: int,
) -> dict[str, Any]:
    # The record builder packs and validates choices exactly as a record's.
    record = build_record_body(
        request_id=order["request_id"],
        fingerprint_id=fingerprint_id,
        worker_id=order["worker_id"],
        pool="replay",
        tier=0,
        endpoint=order["endpoint"],
        model="replay",
        request={},
        prompt_token_ids=prompt_token_ids,
        choices=[c.choice for c in choices],
        started_at=started_at,
        ttft_ns=total_ns,
        total_ns=total_ns,
        system_fingerprint=system_fingerprint,
    )
    packed = record["choices"]
    for item, c in zip(packed, choices, strict=True):
        if c.margins is not None and len(c.margins) == len(c.choice.token_ids):
            item["margins"] = pack_float32(c.margins)
    return {
        "schema_version": SCHEMA_VERSION,
        "replay_id": order["replay_id"],
        "request_id": order["request_id"],
        "worker_id": order["worker_id"],
        "fingerprint_id": fingerprint_id,
        "prompt_token_ids": record["prompt_token_ids"],
        "choices": packed,
        "system_fingerprint": system_fingerprint,
        "timings": {"started_at": started_at, "total_ns": str(total_ns)},
    }


_FINGERPRINT_ID = re.compile(r"sha256:[0-9a-f]{64}")
_TOTAL_NS = re.compile(r"0|[1-9][0-9]{0,19}")


def check_output(body: Any) -> dict[str, Any]:
    """A replay output's shape, member by member: it is embedded in a log-signed verdict, so
    nothing in it is free-form (no unknown member, no nesting beyond the choices'), and each
    identifier has the form the ledger reads it in."""
    output = _require(body, _OUTPUT_FIELDS, "replay output")
    extra = set(output) - set(_OUTPUT_FIELDS)
    if extra:
        raise _fail(f"replay output has unknown members {sorted(extra)}")
    for name in ("replay_id", "request_id", "worker_id"):
        if not isinstance(output[name], str) or not 0 < len(output[name]) <= 200:
            raise _fail(f"{name} must be a string of 1-200 characters")
    if not isinstance(output["fingerprint_id"], str) or not _FINGERPRINT_ID.fullmatch(
        output["fingerprint_id"]
    ):
        raise _fail("fingerprint_id must be sha256: and 64 lower-case hex digits")
    system = output["system_fingerprint"]
    if system is not None and (not isinstance(system, str) or len(system) > 1000):
        raise _fail("system_fingerprint must be null or a string of at most 1000 characters")
    timings = output["timings"]
    if (
        not isinstance(timings, dict)
        or set(timings) != {"started_at", "total_ns"}
        or not isinstance(timings["started_at"], str)
        or len(timings["started_at"]) > 64
        or not isinstance(timings["total_ns"], str)
        or not _TOTAL_NS.fullmatch(timings["total_ns"])
    ):
        raise _fail('timings must be {"started_at": a time, "total_ns": a decimal string}')
    decode_packed(output["prompt_token_ids"], "prompt_token_ids")
    choices = output["choices"]
    if not isinstance(choices, list):
        raise _fail("choices must be a list")
    for i, choice in enumerate(choices):
        if not isinstance(choice, dict):
            raise _fail(f"choices[{i}] must be an object")
        plain = {k: v for k, v in choice.items() if k != "margins"}
        n = check_choice(plain, i)
        if "margins" in choice:
            m = check_logprobs(decode_packed(choice["margins"], "margins"), "margins")
            if m != n:
                raise _fail(f"choices[{i}]: {m} margins for {n} tokens")
    return output


def _outputs(choices: list[dict[str, Any]], top_field: str | None) -> list[Output]:
    out = []
    for c in choices:
        logprobs = unpack_float32(c["logprobs"]) if c.get("logprobs") is not None else None
        top: list[list[float]] | None = None
        if top_field == "margins" and c.get("margins") is not None:
            top = [[0.0, -m] for m in unpack_float32(c["margins"])]
        elif top_field == "top_logprobs" and c.get("top_logprobs"):
            k = int(c["top_logprobs"]["k"])
            flat = unpack_float32(c["top_logprobs"]["logprobs"])
            top = [flat[i : i + k] for i in range(0, len(flat), k)]
        out.append(Output(unpack_int32(c["token_ids"]), logprobs, top))
    return out


def record_generation(record_body: dict[str, Any]) -> Generation:
    """What a record says was generated (top-k rows when the record has them)."""
    return Generation(
        unpack_int32(record_body["prompt_token_ids"]),
        _outputs(record_body["choices"], "top_logprobs"),
    )


def output_generation(output_body: dict[str, Any]) -> Generation:
    """What a replay produced (its margins, when present, as two-entry top rows)."""
    return Generation(
        unpack_int32(output_body["prompt_token_ids"]),
        _outputs(output_body["choices"], "margins"),
    )


# ---- verdict -----------------------------------------------------------------------------


def build_verdict(
    *,
    replay_id: str,
    request_id: str,
    record: dict[str, Any],
    pool: str,
    worker_id: str,
    worker_key_id: str,
    worker_fingerprint_id: str,
    forced: bool,
    verdict: str,
    reason: str | None,
    comparison: dict[str, Any] | None,
    fingerprint_diff: list[dict[str, Any]] | None,
    output: dict[str, Any] | None,
    output_digest: str | None = None,
) -> dict[str, Any]:
    """The verdict body. A replay of a schema v2 record does not embed the worker's output
    (that would put the record's content in the log): ``output`` is None and
    ``output_digest`` the digest of a ``replay_output`` disclosure of it, stored apart like
    the record's own and erased with them."""
    if verdict not in VERDICTS:
        raise _fail(f"unknown verdict {verdict!r}")
    if not _REPLAY_ID.fullmatch(replay_id):
        raise _fail(f"bad replay ID {replay_id!r}")
    signer = (output or {}).get("signature", {}).get("key_id")
    if output is not None and signer != worker_key_id:
        raise _fail(f"the output is signed by {signer}, not by the worker's key {worker_key_id}")
    committed = {"output_digest": output_digest} if output_digest is not None else {}
    return {
        **committed,
        "schema_version": SCHEMA_VERSION,
        "replay_id": replay_id,
        "request_id": request_id,
        "record": record,
        "pool": pool,
        "worker_id": worker_id,
        "worker_key_id": worker_key_id,
        "worker_fingerprint_id": worker_fingerprint_id,
        "forced": forced,
        "verdict": verdict,
        "reason": reason,
        "comparison": comparison,
        "fingerprint_diff": fingerprint_diff,
        "output": output,
        "replayed_at": _now(),
    }
