"""Inference records: the body schema (version 1), its strict validation, and a builder.

A record body is a plain JSON object; every numeric array is packed (see ``ledger.packing``).

    {
      "schema_version": 1,
      "request_id": "req-…",                 # 1-200 chars of [A-Za-z0-9._:-]
      "fingerprint_id": "sha256:<64 hex>",   # the environment that produced the output
      "worker_id": "w1", "pool": "strict",
      "tier": 0 | 1 | 2,
      "endpoint": "/v1/completions" | "/v1/chat/completions",
      "model": "served model name",
      "request": {...},                      # the request body as sent to the engine
      "request_raw": "<base64>",             # optional: its exact bytes
      "prompt_token_ids": "<int32 LE b64>",
      "choices": [{
          "index": 0,
          "token_ids": "<int32 LE b64>",
          "logprobs": "<float32 LE b64>",    # optional; one per token when present
          "top_logprobs": {"k": 5, "token_ids": "<int32 b64>", "logprobs": "<float32 b64>"},
                                             # optional; k per output token, row-major,
                                             # each row highest logprob first
          "finish_reason": "stop" | "length" | … | null,
          "stop_reason": "…" | 123 | null,
          "text": "…"                        # optional
      }],
      "usage": {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21},
      "timings": {"started_at": "2026-11-29T09:00:00.123456Z", "ttft_ns": "1200000",
                  "total_ns": "53000000"},
      "system_fingerprint": "vllm-0.32.0-1a2b3c4d" | null,
      "aborted": false                       # optional: client or engine gone mid-stream
    }
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from ledger.errors import InvalidInput
from ledger.packing import (
    check_logprobs,
    check_token_ids,
    decode_packed,
    pack_float32,
    pack_int32,
    strict_b64decode,
)

RECORD_KIND = "inference_record"
RECORD_SCHEMA_VERSION = 1
ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
MAX_TOP_K = 64

# "." and ".." are refused: no URL path can name them (clients resolve them away).
REQUEST_ID_PATTERN = r"^(?!\.{1,2}$)[A-Za-z0-9._:\-]{1,200}$"
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)


def is_request_id(value: str) -> bool:
    """Whether ``value`` can name a record: 1-200 of ``[A-Za-z0-9._:-]``, not ``.`` or ``..``."""
    return _REQUEST_ID.fullmatch(value) is not None


def check_request_id(value: object) -> str:
    """``value``, if it can name a record; InvalidInput ``invalid_parameters`` otherwise (a
    lookup or a hold by a name no record can have; never echoes it back)."""
    if not isinstance(value, str) or not is_request_id(value):
        raise InvalidInput(
            "a request ID is 1-200 characters of A-Z a-z 0-9 . _ : - (not . or ..)",
            code="invalid_parameters",
        )
    return value


_FINGERPRINT_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9._\-]{1,100}$")
_INT_STRING = re.compile(r"^(0|[1-9][0-9]{0,19})$")

_REQUIRED = {
    "schema_version",
    "request_id",
    "fingerprint_id",
    "worker_id",
    "pool",
    "tier",
    "endpoint",
    "model",
    "request",
    "prompt_token_ids",
    "choices",
    "usage",
    "timings",
    "system_fingerprint",
}
_OPTIONAL = {"request_raw", "aborted"}
_CHOICE_REQUIRED = {"index", "token_ids", "finish_reason", "stop_reason"}
_CHOICE_OPTIONAL = {"logprobs", "top_logprobs", "text"}


def _fail(message: str, code: str = "schema_violation", **details: Any) -> InvalidInput:
    return InvalidInput(message, code=code, details=details)


def _int(value: object, field: str, lo: int = 0, hi: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(f"{field} must be an integer", field=field)
    if value < lo or (hi is not None and value > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise _fail(f"{field} must be in {rng}, got {value}", field=field)
    return value


def _str(value: object, field: str, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(f"{field} must be a non-empty string", field=field)
    if pattern is not None and not pattern.fullmatch(value):
        raise _fail(f"{field} {value[:80]!r} does not match {pattern.pattern}", field=field)
    return value


class RecordSummary(NamedTuple):
    """The indexed facts of a validated record body (what search filters on). A named tuple:
    every record ingested, audited or verified builds one, or two."""

    request_id: str
    fingerprint_id: str
    worker_id: str
    pool: str
    tier: int
    endpoint: str
    model: str
    choices: int
    output_tokens: int


def check_choice(choice: object, i: int) -> int:
    where = f"choices[{i}]"
    if not isinstance(choice, dict):
        raise _fail(f"{where} must be an object", field=where)
    missing = _CHOICE_REQUIRED - set(choice)
    if missing:
        raise _fail(f"{where} is missing {sorted(missing)}", field=where)
    extra = set(choice) - _CHOICE_REQUIRED - _CHOICE_OPTIONAL
    if extra:
        raise _fail(f"{where} has unknown members {sorted(extra)}", field=where)
    _int(choice["index"], f"{where}.index", 0, 10_000)
    n = check_token_ids(
        decode_packed(choice["token_ids"], f"{where}.token_ids"), f"{where}.token_ids"
    )
    if "logprobs" in choice and choice["logprobs"] is not None:
        m = check_logprobs(
            decode_packed(choice["logprobs"], f"{where}.logprobs"), f"{where}.logprobs"
        )
        if m != n:
            raise _fail(
                f"{where}: {m} logprobs for {n} output tokens",
                code="length_mismatch",
                field=f"{where}.logprobs",
            )
    top = choice.get("top_logprobs")
    if top is not None:
        if not isinstance(top, dict) or set(top) != {"k", "token_ids", "logprobs"}:
            raise _fail(f'{where}.top_logprobs must be {{"k", "token_ids", "logprobs"}}')
        k = _int(top["k"], f"{where}.top_logprobs.k", 1, MAX_TOP_K)
        tid = check_token_ids(
            decode_packed(top["token_ids"], f"{where}.top_logprobs.token_ids"),
            f"{where}.top_logprobs.token_ids",
        )
        tlp = check_logprobs(
            decode_packed(top["logprobs"], f"{where}.top_logprobs.logprobs"),
            f"{where}.top_logprobs.logprobs",
        )
        if tid != n * k or tlp != n * k:
            raise _fail(
                f"{where}.top_logprobs: expected {n} tokens x k={k} = {n * k} entries, "
                f"got {tid} IDs and {tlp} logprobs",
                code="length_mismatch",
                field=f"{where}.top_logprobs",
            )
    for name in ("finish_reason",):
        if choice[name] is not None and not isinstance(choice[name], str):
            raise _fail(f"{where}.{name} must be a string or null")
    stop = choice["stop_reason"]
    if stop is not None and (not isinstance(stop, str | int) or isinstance(stop, bool)):
        raise _fail(f"{where}.stop_reason must be a string, an integer or null")
    if "text" in choice and not isinstance(choice["text"], str):
        raise _fail(f"{where}.text must be a string")
    return n


def validate_record_body(body: dict[str, Any]) -> RecordSummary:
    """Validate an inference record body of schema version 1 and return its summary.

    Raises InvalidInput naming the first problem: schema violations, bad packing,
    negative token IDs, NaN/Inf logprobs, and array lengths that disagree. (A version 2 body
    is checked with its disclosures: ``ledger.inference_record.parse_record``.)
    """
    check_version(body, (RECORD_SCHEMA_VERSION,))
    missing = _REQUIRED - set(body)
    if missing:
        raise _fail(f"record is missing {sorted(missing)}")
    extra = set(body) - _REQUIRED - _OPTIONAL
    if extra:
        raise _fail(f"record has unknown members {sorted(extra)}")
    return check_content(body, check_common(body))


def check_version(body: dict[str, Any], versions: tuple[int, ...]) -> int:
    version = body.get("schema_version")
    if type(version) is not int or version not in versions:  # true and 1.0 are not 1
        raise _fail(
            f"unsupported record schema_version {version!r}; this ledger reads "
            f"{' and '.join(map(str, versions))}",
            code="unsupported_schema_version",
        )
    return version


def check_common(body: dict[str, Any]) -> RecordSummary:
    """The members every schema version holds in the clear (IDs, routing, usage, timings);
    the summary's ``output_tokens`` is 0 until :func:`check_content` counts them."""
    request_id = _str(body["request_id"], "request_id", _REQUEST_ID)
    fingerprint_id = _str(body["fingerprint_id"], "fingerprint_id", _FINGERPRINT_ID)
    worker_id = _str(body["worker_id"], "worker_id", _NAME)
    pool = _str(body["pool"], "pool", _NAME)
    tier = _int(body["tier"], "tier", 0, 2)
    endpoint = body["endpoint"]
    if endpoint not in ENDPOINTS:
        raise _fail(f"endpoint must be one of {list(ENDPOINTS)}, got {endpoint!r}")
    model = _str(body["model"], "model")
    if len(model) > 300:
        raise _fail("model name longer than 300 characters")
    if "aborted" in body and not isinstance(body["aborted"], bool):
        raise _fail("aborted must be a boolean")
    choices = body["choices"]
    if not isinstance(choices, list) or not choices:
        raise _fail("choices must be a non-empty list")
    usage = body["usage"]
    if not isinstance(usage, dict):
        raise _fail("usage must be an object")
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if key in usage:
            _int(usage[key], f"usage.{key}")
    timings = body["timings"]
    if not isinstance(timings, dict):
        raise _fail("timings must be an object")
    if "started_at" in timings:
        _parse_time(timings["started_at"], "timings.started_at")
    for key in ("ttft_ns", "total_ns"):
        if key in timings and (
            not isinstance(timings[key], str) or not _INT_STRING.fullmatch(timings[key])
        ):
            raise _fail(f"timings.{key} must be a decimal integer string (nanoseconds)")
    sf = body["system_fingerprint"]
    if sf is not None and not isinstance(sf, str):
        raise _fail("system_fingerprint must be a string or null")
    return RecordSummary(
        request_id=request_id,
        fingerprint_id=fingerprint_id,
        worker_id=worker_id,
        pool=pool,
        tier=tier,
        endpoint=endpoint,
        model=model,
        choices=len(choices),
        output_tokens=0,
    )


def check_content(view: dict[str, Any], summary: RecordSummary) -> RecordSummary:
    """The content members of a v1-shaped body (a v1 body, or a v2 body with every
    disclosure opened): the request, packed arrays and their lengths, choice indexes."""
    if not isinstance(view.get("request"), dict):
        raise _fail("request must be the JSON object sent to the engine")
    if "request_raw" in view:
        _check_base64(view["request_raw"], "request_raw")
    check_token_ids(decode_packed(view["prompt_token_ids"], "prompt_token_ids"), "prompt_token_ids")
    choices = view["choices"]
    output_tokens = sum(check_choice(c, i) for i, c in enumerate(choices))
    indexes = [c["index"] for c in choices]
    if len(set(indexes)) != len(indexes):
        raise _fail("choices have duplicate index values")
    return summary._replace(output_tokens=output_tokens)


def _check_base64(value: object, field: str) -> None:
    try:
        if not isinstance(value, str):
            raise ValueError("not a string")
        strict_b64decode(value)
    except (ValueError, binascii.Error, UnicodeEncodeError) as exc:
        raise _fail(f"{field} must be a base64 string ({exc})", field=field) from exc


# How far a collector's clock may run ahead of the ledger's: ingest holds off (503, until its
# clock catches up) a record whose request starts later than its receive time plus this, and
# the audit reports a receive time earlier than its start less this (a time moved back).
STARTED_SKEW = timedelta(seconds=60)


def started_at(body: dict[str, Any]) -> datetime | None:
    """When a record body says its request started, by its collector's clock
    (``timings.started_at``); None when it does not say, or not as validation requires."""
    timings = body.get("timings")
    if not isinstance(timings, dict) or "started_at" not in timings:
        return None
    try:
        return _parse_time(timings["started_at"], "timings.started_at")
    except InvalidInput:
        return None


def _parse_time(value: object, field: str) -> datetime:
    """A logged time as records of every ledger version were validated: an ISO 8601 date-time
    with a zone (``ledger.clock.parse_rfc3339`` is stricter, and ingest applies it to new
    records: an older record's time stays readable, by the audit and by verify.js alike)."""
    if not isinstance(value, str):
        raise _fail(f"{field} must be an RFC 3339 string")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise _fail(f"{field} is not RFC 3339: {value!r}") from exc
    if parsed.tzinfo is None:
        raise _fail(f"{field} must carry a time zone (use Z for UTC)")
    return parsed


@dataclass(frozen=True)
class Choice:
    """Builder input for one output choice (plain Python lists, packed on build)."""

    token_ids: Sequence[int]
    logprobs: Sequence[float] | None = None
    top_k_ids: Sequence[Sequence[int]] | None = None
    top_k_logprobs: Sequence[Sequence[float]] | None = None
    finish_reason: str | None = "stop"
    stop_reason: str | int | None = None
    text: str | None = None


def build_record_body(
    *,
    request_id: str,
    fingerprint_id: str,
    worker_id: str,
    pool: str,
    tier: int,
    endpoint: str,
    model: str,
    request: dict[str, Any],
    prompt_token_ids: Sequence[int],
    choices: Sequence[Choice],
    started_at: str,
    ttft_ns: int,
    total_ns: int,
    system_fingerprint: str | None,
    request_raw: str | None = None,
    aborted: bool | None = None,
) -> dict[str, Any]:
    """Assemble (and validate) a record body from Python values."""
    packed_choices = []
    completion = 0
    for i, c in enumerate(choices):
        item: dict[str, Any] = {
            "index": i,
            "token_ids": pack_int32(c.token_ids),
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }
        if c.logprobs is not None:
            item["logprobs"] = pack_float32(c.logprobs)
        if c.top_k_ids is not None and c.top_k_logprobs is not None:
            k = len(c.top_k_ids[0]) if c.top_k_ids else 1
            item["top_logprobs"] = {
                "k": k,
                "token_ids": pack_int32(x for row in c.top_k_ids for x in row),
                "logprobs": pack_float32(x for row in c.top_k_logprobs for x in row),
            }
        if c.text is not None:
            item["text"] = c.text
        completion += len(c.token_ids)
        packed_choices.append(item)
    body: dict[str, Any] = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "request_id": request_id,
        "fingerprint_id": fingerprint_id,
        "worker_id": worker_id,
        "pool": pool,
        "tier": tier,
        "endpoint": endpoint,
        "model": model,
        "request": request,
        "prompt_token_ids": pack_int32(prompt_token_ids),
        "choices": packed_choices,
        "usage": {
            "prompt_tokens": len(prompt_token_ids),
            "completion_tokens": completion,
            "total_tokens": len(prompt_token_ids) + completion,
        },
        "timings": {"started_at": started_at, "ttft_ns": str(ttft_ns), "total_ns": str(total_ns)},
        "system_fingerprint": system_fingerprint,
    }
    if request_raw is not None:
        body["request_raw"] = request_raw
    if aborted is not None:
        body["aborted"] = aborted
    validate_record_body(body)
    return body
