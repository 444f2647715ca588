"""The client's request fields as vLLM 0.32's request models read them (what the collector acts on).

vLLM parses a body with ``json.loads`` and validates it with pydantic in lax mode
(``vllm/entrypoints/openai/{completion,chat_completion}/protocol.py``): ``"stream": "false"``
is false, ``"logprobs": true`` is 1 on completions, ``"temperature": "0"`` is 0.0, a seed is an
int64. The collector decides on the same values (whether to stream, what to hide from the
client, the tier), never on Python truthiness. The rules here are pydantic-core's for the
values listed in ``tests/collectors/test_vllm_request.py``, which checks them against vLLM's own
models; any other value raises :class:`Unsure`, and the collector then sends the client's
request to vLLM unchanged and passes its answer through (vLLM refuses almost all of them).

vLLM imports nothing of ours and we import nothing of vLLM's: it runs in its own environment.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from ledger.canonical import written_as_unsafe_integer
from ledger.compact_json import compact_json

JSON_MEDIA_TYPE = "application/json"
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_INT_TEXT = re.compile(r"[+-]?[0-9]+(\.0+)?")
_FLOAT_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_INT64 = (-(2**63), 2**63 - 1)
_WHITESPACE = " \t\n\r\x0b\x0c"


class Unsure(Exception):
    """The collector cannot tell what vLLM would make of a request (or vLLM refuses it)."""


def is_json_media_type(content_type: str | None) -> bool:
    """vLLM's ``validate_json_request``: the media type, lower-cased, is application/json."""
    return (content_type or "").lower().split(";", maxsplit=1)[0] == JSON_MEDIA_TYPE


@dataclass(frozen=True)
class RequestJson:
    """A request body as vLLM's ``json.loads`` reads it, and whether it held a non-finite
    number: ``NaN``, ``Infinity``, ``-Infinity``, or a literal beyond a float's range
    (``1e400``)."""

    value: Any
    nonfinite: bool

    def engine_bytes(self, body: Any) -> bytes:
        """``body`` (this request as the engine gets it) written as JSON vLLM reads back to
        the same values: a non-finite number as ``json.dumps`` writes it (``NaN``,
        ``Infinity``), which vLLM's ``json.loads`` reads as it read the client's; orjson
        would write ``null``, a different request (vLLM refuses ``top_p: NaN``, and takes
        ``top_p: null`` as its default)."""
        if not self.nonfinite:
            return compact_json(body)
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def read_request_json(raw: bytes) -> RequestJson:
    """Parse a request body as vLLM does (``json.loads``: ValueError or RecursionError when
    it is not JSON), noting a non-finite number in it."""
    nonfinite = False

    def number(text: str) -> float:
        nonlocal nonfinite
        value = float(text)
        nonfinite = nonfinite or not math.isfinite(value)
        return value

    def constant(text: str) -> float:  # NaN, Infinity, -Infinity
        nonlocal nonfinite
        nonfinite = True
        return float(text)

    value = json.loads(raw, parse_float=number, parse_constant=constant)
    return RequestJson(value, nonfinite)


def lax_bool(value: object, name: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
    raise Unsure(f"{name}: {value!r} is not a boolean vLLM reads")


def lax_int(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, str) and value.isascii():
        text = value.strip(_WHITESPACE)
        if _INT_TEXT.fullmatch(text):
            return int(text.split(".")[0])
    raise Unsure(f"{name}: {value!r} is not an integer vLLM reads")


def lax_float(value: object, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):  # bool included: true is 1.0
        return float(value)
    if isinstance(value, str) and value.isascii():
        text = value.strip(_WHITESPACE)
        if _FLOAT_TEXT.fullmatch(text):
            return float(text)
    raise Unsure(f"{name}: {value!r} is not a number vLLM reads")


def _raw_number(body: dict[str, Any], name: str) -> int | None:
    """vLLM's ``check_logprobs`` runs before coercion: these must be JSON numbers (or null)."""
    value = body.get(name)
    if value is not None and not isinstance(value, int | float):
        raise Unsure(f"{name} must be a number")
    number = lax_int(value, name)
    if number is not None and number < 0 and number != -1:
        raise Unsure(f"{name} must be positive or -1")
    return number


@dataclass(frozen=True)
class Judged:
    """The fields the collector acts on, as vLLM's request model holds them."""

    stream: bool
    return_token_ids: bool
    return_tokens_as_token_ids: bool
    echo: bool
    # Completions: top-k per position (None: no logprobs). Chat: 1 with logprobs, else None.
    logprobs: int | None
    top_logprobs: int | None  # chat only
    prompt_logprobs: int | None
    logprob_token_ids: bool  # given and non-empty (vLLM's validators test it raw)
    temperature: float | None
    seed: int | None


def judge(endpoint_is_chat: bool, body: dict[str, Any]) -> Judged:
    """Read ``body`` as vLLM would, or raise :class:`Unsure`."""
    if endpoint_is_chat:
        flag = lax_bool(body.get("logprobs"), "logprobs")
        logprobs = 1 if flag else None
        top = _raw_number(body, "top_logprobs")
    else:
        logprobs = _raw_number(body, "logprobs")
        top = None
    seed = lax_int(body.get("seed"), "seed")
    if seed is not None and not _INT64[0] <= seed <= _INT64[1]:
        raise Unsure("seed must be an int64")
    temperature = lax_float(body.get("temperature"), "temperature")
    if temperature is not None and math.isnan(temperature):
        raise Unsure("temperature is NaN")
    return Judged(
        stream=bool(lax_bool(body.get("stream"), "stream")),
        return_token_ids=bool(lax_bool(body.get("return_token_ids"), "return_token_ids")),
        return_tokens_as_token_ids=bool(
            lax_bool(body.get("return_tokens_as_token_ids"), "return_tokens_as_token_ids")
        ),
        echo=bool(lax_bool(body.get("echo"), "echo")),
        logprobs=logprobs,
        top_logprobs=top,
        prompt_logprobs=_raw_number(body, "prompt_logprobs"),
        logprob_token_ids=bool(body.get("logprob_token_ids")),
        temperature=temperature,
        seed=seed,
    )


def prompt_kind(body: dict[str, Any]) -> str:
    """``one`` (a string or a list of token IDs, alone or as the only item of a list),
    ``several`` (a list of two or more prompts), or raise :class:`Unsure` (no prompt, prompt
    embeddings, or one vLLM's model refuses or coerces)."""
    prompt = body.get("prompt")
    if body.get("prompt_embeds") is not None:
        raise Unsure("prompt embeddings")
    if isinstance(prompt, str) and prompt:
        return "one"
    if isinstance(prompt, list) and prompt:
        if all(type(t) is int and t >= 0 for t in prompt):
            return "one"
        if all(isinstance(p, str) for p in prompt) or all(
            isinstance(p, list) and p and all(type(t) is int and t >= 0 for t in p) for p in prompt
        ):
            return "one" if len(prompt) == 1 else "several"
    raise Unsure("no prompt vLLM reads as given")


_SAFE = 2**53 - 1
MAX_DEPTH = 64


def recordable(value: Any, depth: int = 0) -> Any:
    """``value`` as a signed record can hold it: integers beyond 2^53 (integral floats from
    2^53 to 1e21 too) as decimal strings and non-finite floats as strings (DESIGN: formats);
    raises :class:`Unsure` for lone surrogates or deep nesting."""
    if depth > MAX_DEPTH:
        raise Unsure(f"nested deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        return {_text(k): recordable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [recordable(v, depth + 1) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -_SAFE <= value <= _SAFE else str(value)
    if isinstance(value, float):
        if written_as_unsafe_integer(value):  # 1e17: JCS writes its digits, an unsafe integer
            return str(int(value))
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        return _text(value)
    raise Unsure(f"{type(value).__name__} in a request")


def _text(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Unsure("a lone surrogate") from exc
    return value
