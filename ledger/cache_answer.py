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
from typing import Any

from ledger.cachekey import CHAT, GREEDY_IRRELEVANT, IGNORED
from ledger.clock import parse_rfc3339
from ledger.compact_json import compact_json
from ledger.inference_record import InferenceRecord, RecordChoice
from ledger.packing import unpack_float32, unpack_int32


def _wants_logprobs(endpoint: str, request: Mapping[str, Any]) -> bool:
    value = request.get("logprobs")
    if endpoint == CHAT:
        return value is True
    return value is not None and value is not False


# The parameters whose default a model's generation_config.json (or vLLM's
# --override-generation-config) replaces (vLLM's ModelConfig.get_diff_sampling_param).
SERVER_DEFAULTS = frozenset(
    {
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "max_tokens",
    }
)
# Flags read as JSON booleans here; vLLM's lax models also take 1, "true", "yes": such a
# request is not answered from the cache rather than answered as another flag value.
_FLAGS = ("stream", "echo", "return_token_ids", "return_tokens_as_token_ids", "ignore_eos")


def _given(request: Mapping[str, Any], endpoint: str) -> dict[str, Any]:
    """The request's generation parameters as the client gave them: null is absent (vLLM then
    takes the server's default, which a model's generation_config.json may set), the prompt
    and what cannot change the output left out."""
    prompt = "prompt" if endpoint != CHAT else "messages"
    given = {
        k: v
        for k, v in request.items()
        if v is not None and k != prompt and (k not in IGNORED or k == "model")
    }
    if endpoint == CHAT and "max_completion_tokens" in given:  # vLLM's chat limit
        given["max_tokens"] = given.pop("max_completion_tokens")
    if endpoint != CHAT:  # completions: vLLM fills an absent limit with 16, whatever else says
        given.setdefault("max_tokens", 16)
    if given.get("temperature") == 0 and not isinstance(given.get("temperature"), bool):
        for name in GREEDY_IRRELEVANT:  # greedy: vLLM reads none of them
            given.pop(name, None)
    stop = given.get("stop")
    if isinstance(stop, str):
        given["stop"] = [stop]
    if isinstance(given.get("stop"), list):  # order decides a tie (vLLM's first in the list)
        given["stop"] = list(dict.fromkeys(given["stop"]))
    for name in ("stop_token_ids",):  # a set to vLLM
        if isinstance(given.get(name), list):
            given[name] = sorted(set(given[name]), key=repr)
    return given


def _unlike_recorded(
    endpoint: str, request: Mapping[str, Any], recorded: Mapping[str, Any] | None
) -> str | None:
    """Why ``request`` may not get the answer of ``recorded`` although their keys match: the
    key fills absent parameters with vLLM's built-in defaults and sorts stop strings, but a
    model's generation_config.json replaces those defaults (vLLM's ``generation_config`` is
    ``auto``), the first of two stop strings ending together wins, and ``model`` may name a
    LoRA adapter. Only a request that gives what the recorded one gave is answered."""
    if recorded is None:
        return "the record's request is not held (erased): it cannot be compared"
    prompt, was = request.get("prompt"), recorded.get("prompt")
    if isinstance(prompt, str) and isinstance(was, str) and prompt != was:
        # keyed by the token IDs the lookup gave: the ledger cannot tokenize to check them
        return "the record answered another prompt text (only the token IDs given match)"
    mine, theirs = _given(request, endpoint), _given(recorded, endpoint)
    if mine.get("model") != theirs.get("model"):
        return (
            f"the record answered model {theirs.get('model')!r}, not {mine.get('model')!r} "
            "(a served name may be a LoRA adapter)"
        )
    # Given or not, any other parameter is read as the same value (its default is fixed).
    for name in sorted(SERVER_DEFAULTS & (set(mine) ^ set(theirs))):
        which = "the record's request" if name in theirs else "this request"
        return (
            f"{which} sets {name} and the other leaves it to the engine's default, which the "
            "model's generation config may set to another value"
        )
    if mine.get("stop", []) != theirs.get("stop", []):
        return "the stop strings are in another order (the first in the list wins a tie)"
    return None


def not_servable(
    endpoint: str,
    request: Mapping[str, Any],
    record: InferenceRecord,
    chat_unservable: str | None = None,
) -> str | None:
    """Why this record cannot be rebuilt as the answer to ``request`` (None: it can);
    ``chat_unservable``: why no chat answer of the record's environment is (its fingerprint
    says the engine parses reasoning out of the text, or the template reads the date). A
    request that samples at random is its callers' to refuse first (``not_deterministic``)."""
    if endpoint == CHAT and chat_unservable is not None:
        return chat_unservable
    for flag in _FLAGS:
        if request.get(flag) is not None and type(request.get(flag)) is not bool:
            return f"{flag} must be true or false to be answered from the cache"
    chat_logprobs = request.get("logprobs")
    if endpoint == CHAT and chat_logprobs is not None and type(chat_logprobs) is not bool:
        return "logprobs must be true or false to be answered from the cache"
    refused = _refused_by_vllm(endpoint, request)
    if refused is not None:
        return refused
    why = _unlike_recorded(endpoint, request, record.request)
    if why is not None:
        return why
    if request.get("echo"):
        return "echo asks for the prompt's text, which the record does not split by token"
    if request.get("prompt_logprobs") is not None:
        return "prompt_logprobs asks for per-token prompt logprobs, which are not recorded"
    if request.get("logprob_token_ids") is not None:
        return "logprob_token_ids asks for the logprobs of tokens the record does not hold"
    if endpoint == CHAT and request.get("add_generation_prompt") is False:
        return "without a generation prompt vLLM answers in the last message's role"
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


def _refused_by_vllm(endpoint: str, request: Mapping[str, Any]) -> str | None:
    """Shapes vLLM answers with a 400 although their key is a valid request's (the key
    ignores these members, so their types are checked here as vLLM's request models do)."""
    user = request.get("user")
    if user is not None and not isinstance(user, str):
        return "vLLM refuses a user that is not a string"
    if "request_id" in request and not isinstance(request["request_id"], str):
        return "vLLM refuses a request_id that is not a string"
    options = request.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            return "vLLM refuses stream_options that are not an object"
        for flag in ("include_usage", "continuous_usage_stats"):
            if options.get(flag) is not None and type(options.get(flag)) is not bool:
                return f"stream_options.{flag} must be true or false to be answered from the cache"
    if request.get("stream_options") and request.get("stream") is not True:
        return "vLLM refuses stream_options without stream"
    if endpoint == CHAT:
        top = request.get("top_logprobs")
        if top is not None and top != 0 and request.get("logprobs") is not True:
            return "vLLM refuses top_logprobs without logprobs"
    elif "n" in request and request["n"] is None:
        return "vLLM refuses n: null on completions"
    if "priority" in request and request["priority"] != 0:
        return "a priority (or null) is refused by a server that does not schedule by priority"
    return None


def _created(record: InferenceRecord) -> int:
    try:
        return int(parse_rfc3339(record.timings.get("started_at")).timestamp())
    except ValueError:  # validation requires one, in RFC 3339, when a record names it
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
    else:  # logprobs 0: vLLM still names the sampled token at each position
        top = [{name: lp} for name, lp in zip(names, lps, strict=True)]
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
