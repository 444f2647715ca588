"""Cache keys: one key for every request that must produce the same output, algorithm ``ck1``.

    key = "ck1:sha256:" + hex(SHA-256(JCS({
        "algorithm": "ck1",
        "fingerprint_id": "sha256:…",          # never matches across environments
        "endpoint": "/v1/completions" | "/v1/chat/completions",
        "prompt": {"token_ids": [..]} | {"text": "…"}          # completions
                | {"messages": [..], "chat_template": "sha256:…" | null},   # chat
        "params": {…}                          # every other field, defaults filled in
    })))

Normalization (so equivalent requests agree):

- fields that do not change the generated tokens are dropped: ``stream``, ``stream_options``,
  ``user``, ``model`` (the fingerprint names the model), ``logprobs``, ``top_logprobs``,
  ``return_token_ids``, ``return_tokens_as_token_ids``, ``request_id``, ``priority``;
- absent sampling parameters get their documented defaults (``temperature`` 1, ``top_p`` 1,
  ``top_k`` -1 (0 means the same), ``min_p`` 0, penalties 0 / 1, ``n`` 1, ``max_tokens`` 16
  for completions, unbounded for chat, where ``max_completion_tokens`` is the limit unless it
  is null, and ``max_tokens`` only then, as vLLM reads them);
  ``stop`` as a sorted list, ``stop_token_ids`` sorted, ``ignore_eos`` false; a token ID
  given as an integral float is that integer, in ``stop_token_ids`` and a token-ID prompt);
- under greedy decoding (``temperature`` 0) the sampler's randomness and truncation do not
  matter: ``seed``, ``top_p``, ``top_k`` and ``min_p`` are dropped;
- any other field is kept as given: an unknown parameter may change the output.

A completions prompt can be text or token IDs; the ledger indexes a record under both forms
(the text it was sent and the token IDs the engine saw), so either lookup finds it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ledger.canonical import canonicalize
from ledger.errors import InvalidInput
from ledger.inference_record import InferenceRecord
from ledger.packing import unpack_int32

ALGORITHM = "ck1"
PREFIX = "ck1:sha256:"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"

IGNORED = frozenset(
    {
        "stream",
        "stream_options",
        "user",
        "model",
        "logprobs",
        "top_logprobs",
        "return_token_ids",
        "return_tokens_as_token_ids",
        "request_id",
        "priority",
    }
)
DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "n": 1,
    "seed": None,
    "stop": [],
    "stop_token_ids": [],
    "ignore_eos": False,
}
GREEDY_IRRELEVANT = ("seed", "top_p", "top_k", "min_p")


def _number(value: Any, name: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{name} must be a number, got {value!r}", code="invalid_request")
    return value


def _token_ids(values: Any) -> list[int] | None:
    """``values`` as token IDs, or None when it is not a list of them. An integral float is its
    integer (vLLM reads ``7.0`` as 7, and a signed record's bytes write it ``7``, so the audit
    reads it back as 7); a boolean is not one."""
    if not isinstance(values, list):
        return None
    if all(type(t) is int for t in values):
        return values
    if all(type(t) is int or (type(t) is float and t.is_integer()) for t in values):
        return [int(t) for t in values]
    return None


def normalize_params(endpoint: str, request: dict[str, Any]) -> dict[str, Any]:
    """The request's parameters other than the prompt, normalized as the module says."""
    prompt_fields = ("prompt",) if endpoint == COMPLETIONS else ("messages",)
    params = {k: v for k, v in request.items() if k not in IGNORED and k not in prompt_fields}
    if endpoint == CHAT and "max_completion_tokens" in params:
        # vLLM's chat limit: max_completion_tokens unless it is null, then max_tokens
        limit = params.pop("max_completion_tokens")
        if limit is not None:
            params["max_tokens"] = limit
    for name, default in DEFAULTS.items():
        if params.get(name) is None:
            params[name] = default
    if endpoint == COMPLETIONS and params.get("max_tokens") is None:
        params["max_tokens"] = 16
    params.setdefault("max_tokens", None)
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"):
        _number(params[name], name)
    _number(params["top_k"], "top_k")  # false is not 0
    if params["top_k"] == 0:
        params["top_k"] = -1
    stop = params["stop"]
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise InvalidInput("stop must be a string or a list of strings", code="invalid_request")
    params["stop"] = sorted(set(stop))
    ids = _token_ids(params["stop_token_ids"])
    if ids is None:
        raise InvalidInput("stop_token_ids must be a list of integers", code="invalid_request")
    params["stop_token_ids"] = sorted(set(ids))
    if params["temperature"] == 0:
        for name in GREEDY_IRRELEVANT:
            params.pop(name, None)
    return params


def is_deterministic(request: Mapping[str, Any]) -> bool:
    """Greedy (temperature 0) or seeded sampling: the same environment gives the same output.
    The cache-key index's ``deterministic`` flag, which the audit recomputes: any seed given
    counts (what is served goes by :func:`samples_at_random`)."""
    return _greedy(request) or request.get("seed") is not None


def samples_at_random(request: Mapping[str, Any]) -> bool:
    """Sampled without a seed as vLLM reads the request: not greedy, and no seed or seed -1,
    which vLLM takes for none (``-1``, ``-1.0`` or ``"-1"``, as its lax integer reading
    takes them). Its output is not reproducible: never a cache answer, and a replay of it is
    expected to differ. The temperature is read as vLLM reads it too (``"0"`` and false are
    0), as the collector's tier check reads it."""
    temperature = request.get("temperature")
    if isinstance(temperature, str) and temperature.isascii():
        try:
            temperature = float(temperature.strip())
        except ValueError:
            temperature = None  # vLLM refuses it: the request never ran
    if isinstance(temperature, int | float) and temperature == 0:  # false is 0 to vLLM
        return False
    seed = request.get("seed")
    if seed is None:
        return True
    try:
        return type(seed) is not bool and float(seed) == -1.0
    except (TypeError, ValueError, OverflowError):
        return False  # vLLM refuses such a seed: the request never ran


def _greedy(request: Mapping[str, Any]) -> bool:
    temperature = request.get("temperature")
    return temperature == 0 and not isinstance(temperature, bool)  # false is not 0


def _prompt(
    endpoint: str,
    request: dict[str, Any],
    prompt_token_ids: list[int] | None,
    chat_template: str | None,
) -> dict[str, Any]:
    if endpoint == CHAT:
        messages = request.get("messages")
        if not isinstance(messages, list):
            raise InvalidInput("a chat request needs a messages list", code="invalid_request")
        return {"messages": messages, "chat_template": chat_template}
    if endpoint != COMPLETIONS:
        raise InvalidInput(f"no cache key for endpoint {endpoint!r}", code="invalid_request")
    if prompt_token_ids is not None:
        return {"token_ids": list(prompt_token_ids)}
    prompt = request.get("prompt")
    ids = _token_ids(prompt) if prompt else None
    if ids is not None:
        return {"token_ids": ids}
    if isinstance(prompt, str):
        return {"text": prompt}
    raise InvalidInput(
        "a completions request needs one prompt: a string or a list of token IDs",
        code="invalid_request",
    )


def cache_key(
    endpoint: str,
    request: dict[str, Any],
    fingerprint_id: str,
    *,
    prompt_token_ids: list[int] | None = None,
    chat_template: str | None = None,
) -> str:
    """The ``ck1`` key of ``request`` under ``fingerprint_id``.

    ``prompt_token_ids`` (completions only) keys the prompt by the IDs the engine saw instead
    of the request's text; ``chat_template`` is the template digest of the fingerprint's model.
    A request whose prompt is itself token IDs is run as those IDs: other ``prompt_token_ids``
    are refused (InvalidInput), never keyed in their place.
    """
    if not isinstance(request, dict):
        raise InvalidInput("the request must be a JSON object", code="invalid_request")
    if endpoint == COMPLETIONS and prompt_token_ids is not None:
        own = _token_ids(request.get("prompt"))
        ids = list(prompt_token_ids)
        if own is not None and request.get("truncate_prompt_tokens") is not None:
            own = own[-len(ids) :] if ids else own  # vLLM keeps the prompt's last tokens
        if own is not None and own != ids:
            raise InvalidInput(
                "prompt_token_ids differ from the request's own prompt, which is token IDs: "
                "vLLM runs the prompt's IDs (send them, or no prompt_token_ids)",
                code="invalid_request",
            )
    prompt = _prompt(endpoint, request, prompt_token_ids, chat_template)
    return _key(_head(endpoint, request, fingerprint_id), prompt)


def record_keys(
    endpoint: str,
    request: dict[str, Any],
    fingerprint_id: str,
    *,
    prompt_token_ids: list[int] | None = None,
    chat_template: str | None = None,
) -> list[str]:
    """Every key a record of ``request`` is indexed under, sorted.

    Chat: the one key. Completions: the key of the token IDs the engine saw (when given),
    and, when the request's prompt is text, the key of that text too. The same keys as
    ``cache_key`` gives for each prompt form, with the parameters normalized once.
    """
    if not isinstance(request, dict):
        raise InvalidInput("the request must be a JSON object", code="invalid_request")
    if endpoint == COMPLETIONS and prompt_token_ids is not None:
        prompts = [_prompt(endpoint, request, prompt_token_ids, None)]
        if isinstance(request.get("prompt"), str):
            prompts.append(_prompt(endpoint, request, None, None))
    else:
        prompts = [_prompt(endpoint, request, None, chat_template)]
    head = _head(endpoint, request, fingerprint_id)
    return sorted({_key(head, prompt) for prompt in prompts})


def keys_of_record(record: InferenceRecord, chat_template: str | None) -> list[str]:
    """The keys a record is indexed under: ``record_keys`` of its request and prompt token
    IDs. None when its request cannot be keyed or its content was erased (an erasure deletes
    its keys, and the audit expects none)."""
    if not record.complete or record.request is None:
        return []
    try:
        ids = (
            unpack_int32(record.prompt_token_ids)
            if record.endpoint != CHAT and record.prompt_token_ids is not None
            else None
        )
        return record_keys(
            record.endpoint,
            record.request,
            record.fingerprint_id,
            prompt_token_ids=ids,
            chat_template=chat_template,
        )
    except InvalidInput:
        return []


_HEADS: dict[tuple[Any, ...], bytes] = {}
_HEADS_MAX = 4096
_MEMO_SCALARS = frozenset({str, int, float, bool, type(None)})


def _memo_key(
    endpoint: str, request: dict[str, Any], fingerprint_id: str
) -> tuple[Any, ...] | None:
    """What ``_head`` depends on, as a hashable value, or None when a member is a container
    other than a flat list (those heads are computed each time).

    Every parameter is keyed by its type as well as its value, since ``1``, ``1.0`` and
    ``True`` are equal in Python but not in a cache key."""
    prompt_field = "prompt" if endpoint == COMPLETIONS else "messages"
    members: list[tuple[Any, ...]] = []
    for name, value in request.items():
        if name == prompt_field:
            continue
        kind = type(value)
        if kind in _MEMO_SCALARS:
            members.append((name, kind, value))
        elif kind is list and all(type(item) in _MEMO_SCALARS for item in value):
            members.append((name, list, tuple((type(item), item) for item in value)))
        else:
            return None
    return (endpoint, fingerprint_id, tuple(members))


def _head(endpoint: str, request: dict[str, Any], fingerprint_id: str) -> bytes:
    """``_head_of``, remembered for the last few thousand distinct parameter sets (a log's
    requests mostly share their parameters; the prompt is not part of the head)."""
    memo = _memo_key(endpoint, request, fingerprint_id)
    if memo is None:
        return _head_of(endpoint, request, fingerprint_id)
    head = _HEADS.get(memo)
    if head is None:
        head = _head_of(endpoint, request, fingerprint_id)  # a refusal raises: nothing kept
        if len(_HEADS) >= _HEADS_MAX:
            _HEADS.clear()
        _HEADS[memo] = head
    return head


def _head_of(endpoint: str, request: dict[str, Any], fingerprint_id: str) -> bytes:
    """The canonical document up to its last member: RFC 8785 orders the members
    ``algorithm`` < ``endpoint`` < ``fingerprint_id`` < ``params`` < ``prompt``."""
    document = {
        "algorithm": ALGORITHM,
        "fingerprint_id": fingerprint_id,
        "endpoint": endpoint,
        "params": normalize_params(endpoint, request),
    }
    return canonicalize(document)[:-1] + b',"prompt":'


def _key(head: bytes, prompt: dict[str, Any]) -> str:
    return PREFIX + hashlib.sha256(head + canonicalize(prompt) + b"}").hexdigest()
