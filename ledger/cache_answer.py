"""A cache hit as the client would have had it from vLLM: the OpenAI-compatible response,
rebuilt from a logged record for the request being looked up.

The record holds what the engine answered (each choice's text, token IDs, logprobs, finish and
stop reasons, the usage and the prompt's token IDs), so :func:`response` rebuilds vLLM's answer
for a request whose key matched: the same ``id`` (vLLM names it after the request ID the
collector sent, ``cmpl-<ID>`` or ``chatcmpl-<ID>``), ``created`` (the second the request
started), served model name, choices and usage; the token IDs when the request asks for them
(``return_token_ids``). What the ledger cannot rebuild makes the request *not servable*
(:func:`not_servable` says why) rather than answered differently:

- per-token strings: a logprobs answer names each token, and the ledger has no tokenizer. A
  completions request that asks for logprobs with ``return_tokens_as_token_ids`` (each token
  named ``token_id:<ID>``, as vLLM then does) is served, up to the record's top-k depth; any
  other logprobs request (chat's ``bytes`` are the token's own) is not;
- ``echo`` and ``prompt_logprobs`` (the prompt's text and logprobs per token) and tool calls
  (``tools``: vLLM's parser turns the text into calls).

:func:`sse` renders a response as the server-sent events of a streamed answer: one chunk per
choice with its whole text, a closing chunk per choice with its finish reason, the usage chunk
when ``stream_options.include_usage`` asks, and ``data: [DONE]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ledger.cachekey import CHAT
from ledger.compact_json import compact_json
from ledger.inference_record import InferenceRecord, RecordChoice
from ledger.packing import unpack_float32, unpack_int32


def _wants_logprobs(endpoint: str, request: Mapping[str, Any]) -> bool:
    value = request.get("logprobs")
    if endpoint == CHAT:
        return value is True
    return value is not None and value is not False


def not_servable(endpoint: str, request: Mapping[str, Any], record: InferenceRecord) -> str | None:
    """Why this record cannot be rebuilt as the answer to ``request`` (None: it can)."""
    if request.get("echo"):
        return "echo asks for the prompt's text, which the record does not split by token"
    if request.get("prompt_logprobs") is not None:
        return "prompt_logprobs asks for per-token prompt logprobs, which are not recorded"
    if request.get("tools") and request.get("tool_choice") != "none":
        return "tool calls are parsed from the text by the engine's parser; the ledger has none"
    if _wants_logprobs(endpoint, request):
        if endpoint == CHAT or request.get("return_tokens_as_token_ids") is not True:
            return (
                "logprobs name each token, and the ledger has no tokenizer: ask completions "
                "with return_tokens_as_token_ids, or without logprobs"
            )
        k = request["logprobs"]
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            return "logprobs must be a non-negative integer"
        for c in record.choices:
            if c.logprobs is None or (k and (c.top_logprobs or {}).get("k", 0) < k):
                return f"the record holds no logprobs to a depth of {k}"
    return None


def _created(record: InferenceRecord) -> int:
    started = record.timings.get("started_at")
    try:
        return int(datetime.fromisoformat(str(started).replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0


def _token_logprobs(choice: RecordChoice, k: int) -> dict[str, Any]:
    """A completions choice's ``logprobs``, tokens named ``token_id:<ID>`` (as vLLM does with
    return_tokens_as_token_ids): the sampled token's logprob, and its top ``k`` (the sampled
    token too, when it is not among them)."""
    ids = unpack_int32(choice.token_ids or "")
    lps = unpack_float32(choice.logprobs or "")
    names = [f"token_id:{t}" for t in ids]
    offsets, at = [], 0
    for name in names:
        offsets.append(at)
        at += len(name)
    top: list[dict[str, float] | None] = []
    if k and choice.top_logprobs:
        depth = choice.top_logprobs["k"]
        top_ids = unpack_int32(choice.top_logprobs["token_ids"])
        top_lps = unpack_float32(choice.top_logprobs["logprobs"])
        for i, (name, lp) in enumerate(zip(names, lps, strict=True)):
            row = {
                f"token_id:{t}": v
                for t, v in zip(
                    top_ids[i * depth : i * depth + k],
                    top_lps[i * depth : i * depth + k],
                    strict=True,
                )
            }
            row.setdefault(name, lp)
            top.append(row)
    else:
        top = [None] * len(names)
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": names, "top_logprobs": top}


def response(endpoint: str, request: Mapping[str, Any], record: InferenceRecord) -> dict[str, Any]:
    """vLLM's answer to ``request`` as the record holds it (call :func:`not_servable` first)."""
    ids = request.get("return_token_ids") is True
    prompt_ids = unpack_int32(record.prompt_token_ids) if ids and record.prompt_token_ids else None
    usage = dict(record.usage)
    choices: list[dict[str, Any]] = []
    for c in record.choices:
        token_ids = unpack_int32(c.token_ids) if ids and c.token_ids else None
        if endpoint == CHAT:
            choices.append(
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.text or "", "tool_calls": []},
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason,
                    "token_ids": token_ids,
                }
            )
        else:
            logprobs = None
            if _wants_logprobs(endpoint, request):
                logprobs = _token_logprobs(c, int(request["logprobs"]))
            choices.append(
                {
                    "index": c.index,
                    "text": c.text or "",
                    "logprobs": logprobs,
                    "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason,
                    "token_ids": token_ids,
                    "prompt_logprobs": None,
                    "prompt_token_ids": prompt_ids,
                }
            )
    chat = endpoint == CHAT
    out: dict[str, Any] = {
        "id": ("chatcmpl-" if chat else "cmpl-") + record.request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": _created(record),
        "model": record.summary.model,
        "choices": choices,
        "system_fingerprint": record.system_fingerprint,
        "usage": usage,
    }
    if chat:
        out["prompt_logprobs"] = None
        out["prompt_token_ids"] = prompt_ids
    return out


def sse(endpoint: str, request: Mapping[str, Any], answer: Mapping[str, Any]) -> bytes:
    """``answer`` (from :func:`response`) as a streamed answer's server-sent events."""
    chat = endpoint == CHAT
    head = {
        "id": answer["id"],
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": answer["created"],
        "model": answer["model"],
    }
    events: list[dict[str, Any]] = []
    for c in answer["choices"]:
        if chat:
            text = c["message"]["content"]
            events.append(
                {**head, "choices": [_chunk(c, {"role": "assistant", "content": ""}, None)]}
            )
            events.append({**head, "choices": [_chunk(c, {"content": text}, None, ids=True)]})
            events.append({**head, "choices": [_chunk(c, {}, c["finish_reason"], stop=True)]})
        else:
            events.append(
                {
                    **head,
                    "choices": [
                        {
                            "index": c["index"],
                            "text": c["text"],
                            "logprobs": c["logprobs"],
                            "finish_reason": None,
                            "stop_reason": None,
                            "token_ids": c["token_ids"],
                            "prompt_token_ids": c["prompt_token_ids"],
                        }
                    ],
                }
            )
            events.append(
                {
                    **head,
                    "choices": [
                        {
                            "index": c["index"],
                            "text": "",
                            "logprobs": None,
                            "finish_reason": c["finish_reason"],
                            "stop_reason": c["stop_reason"],
                        }
                    ],
                }
            )
    options = request.get("stream_options")
    if isinstance(options, Mapping) and options.get("include_usage") is True:
        events.append({**head, "choices": [], "usage": answer["usage"]})
    return b"".join(b"data: " + compact_json(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _chunk(
    choice: Mapping[str, Any],
    delta: dict[str, Any],
    finish: str | None,
    *,
    ids: bool = False,
    stop: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": choice["index"],
        "delta": delta,
        "logprobs": None,
        "finish_reason": finish,
    }
    if stop:
        out["stop_reason"] = choice["stop_reason"]
    if ids:
        out["token_ids"] = choice["token_ids"]
    return out
