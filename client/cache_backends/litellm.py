"""A LiteLLM cache answered by the ledger: :class:`LedgerLiteLLMCache`.

    import litellm
    from client.cache_backends.litellm import LedgerLiteLLMCache
    litellm.cache = LedgerLiteLLMCache(LEDGER, token, pool="strict")
    litellm.completion(model="hosted_vllm/fixture", api_base=COLLECTOR + "/v1", ...)

LiteLLM's hooks (litellm 1.110, ``litellm/caching/``): ``litellm.cache`` is a
``litellm.caching.caching.Cache``, whose ``get_cache_key(**kwargs)`` is called with the call's
keyword arguments and whose backend (``Cache(_backend=...)``, a ``BaseCache``) is then asked
``get_cache(key, **kw)`` / ``async_get_cache(key, **kw)``. The sync path gives the backend the
key and ``messages`` only (``Cache._get_safe_cache_lookup_kwargs``), not the sampling
parameters, so the key string has to carry the request. The ledger's key (``ck1`` under the
pool's fingerprint) can only be computed by the ledger, and ``get_cache_key`` is synchronous even
in ``acompletion``, so:

1. ``get_cache_key`` rebuilds the exact body LiteLLM would send, with LiteLLM's own request
   builder (``litellm.utils.return_raw_request``: the provider's transformation, no request
   sent; about 20 ms), keeps it, and answers a handle for it (``ledger:`` and the SHA-256 of the
   canonical endpoint and body; the same request, the same handle);
2. the backend's ``get_cache`` / ``async_get_cache`` look the kept request up in the ledger
   (``POST /v1/cache/lookup``, blocking or with an async client, as LiteLLM called) and answer
   a hit as LiteLLM keeps its own entries, ``{"timestamp", "response"}``, the response being
   vLLM's JSON, which LiteLLM turns into a ``ModelResponse`` (``completion``) or a
   ``TextCompletionResponse`` (``text_completion``), or a stream of chunks when ``stream``;
3. ``set_cache`` and the rest store nothing: the collector in front of vLLM records.

The timestamp is the recorded answer's ``created`` second, so ``cache={"s-maxage": N}`` serves
only answers recorded in the last N seconds. The handle, not the ``ck1`` key, is what LiteLLM
reports as the response's ``cache_key``; the ``ck1`` key and the record's request ID are logged
at DEBUG on the ``client.cache_backends`` logger.

What cannot be carried, so a miss, never a guess:

- a provider that is not OpenAI-compatible HTTP (``hosted_vllm/``, ``openai/``,
  ``text-completion-openai/``, ``openai_like``, ``custom_openai``): its body is not the
  OpenAI request a collector records;
- LiteLLM's inner call of ``text_completion`` (a ``completion`` with ``text_completion=True``):
  the outer call was already looked up with its ``prompt``;
- embeddings, image, audio, rerank and Responses API calls: the cache is set up for
  ``completion`` and ``text_completion`` (and their async forms) only;
- a request ``return_raw_request`` cannot build (it says why at DEBUG).

The cache is built with ``max_messages=None``: LiteLLM's default (4) skips any request with more
messages, which the ledger answers as well as any other.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections import OrderedDict
from typing import Any

import litellm
from litellm.caching.base_cache import BaseCache
from litellm.caching.caching import Cache, CacheMode
from litellm.types.caching import CachingSupportedCallTypes
from litellm.types.utils import CallTypes
from litellm.utils import return_raw_request

from client.cache_backends.lookup import (
    CHAT,
    COMPLETIONS,
    LOG,
    Answer,
    LedgerLookup,
    wire_body,
)
from ledger.canonical import canonicalize
from ledger.errors import InvalidInput

# Providers whose body is the OpenAI request, sent over HTTP (to a collector before vLLM).
OPENAI_COMPATIBLE = frozenset(
    {"hosted_vllm", "openai", "text-completion-openai", "openai_like", "custom_openai"}
)
SUPPORTED_CALL_TYPES: list[CachingSupportedCallTypes] = [
    "completion",
    "acompletion",
    "text_completion",
    "atext_completion",
]
# Keyword arguments LiteLLM adds to a call; the rebuilt call must not take them twice.
_INTERNAL = frozenset(
    {
        "litellm_call_id",
        "litellm_logging_obj",
        "parent_otel_span",
        "cache_key",
        "preset_cache_key",
        "api_key",
        "caching",
    }
)
_KEPT = 4096
_QUIET = threading.Lock()


class _Recent:
    """A bounded, thread-safe map: the newest ``size`` entries."""

    def __init__(self, size: int = _KEPT) -> None:
        self._size = size
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


def _cached(answer: Answer) -> dict[str, Any] | None:
    """A hit as LiteLLM keeps its own entries (``Cache._add_cache_logic``)."""
    if not answer.hit or answer.response is None:
        return None
    LOG.debug("ledger cache hit: %s", answer.evidence())
    created = answer.response.get("created")
    timestamp = float(created) if isinstance(created, int | float) else 0.0
    return {"timestamp": timestamp, "response": answer.response}


class _LedgerBackend(BaseCache):
    """Looks up the request behind a handle; stores nothing."""

    def __init__(self, owner: LedgerLiteLLMCache) -> None:
        super().__init__()
        self._owner = owner

    def get_cache(self, key: str, **kwargs: Any) -> dict[str, Any] | None:
        kept = self._owner.kept(key)
        if kept is None:
            return None
        return _cached(self._owner.ledger.lookup(*kept))

    async def async_get_cache(self, key: str, **kwargs: Any) -> dict[str, Any] | None:
        kept = self._owner.kept(key)
        if kept is None:
            return None
        return _cached(await self._owner.ledger.alookup(*kept))

    def set_cache(self, key: str, value: Any, **kwargs: Any) -> None:
        """Nothing to store: the collector records every answer."""

    async def async_set_cache(self, key: str, value: Any, **kwargs: Any) -> None:
        """Nothing to store: the collector records every answer."""

    async def async_set_cache_pipeline(self, cache_list: Any, **kwargs: Any) -> None:
        """Nothing to store: the collector records every answer."""

    async def batch_cache_write(self, key: str, value: Any, **kwargs: Any) -> None:
        """Nothing to store: the collector records every answer."""

    async def disconnect(self) -> None:
        self._owner.ledger.close()


class LedgerLiteLLMCache(Cache):
    """``litellm.cache``, answered by the ledger under ``pool`` (the fingerprint its live
    workers serve) or ``fingerprint_id``. ``mode`` is LiteLLM's: ``default_on`` looks every
    call up, ``default_off`` only those with ``cache={"use-cache": True}``."""

    def __init__(
        self,
        ledger_url: str,
        token: str,
        *,
        pool: str | None = None,
        fingerprint_id: str | None = None,
        timeout: float = 10.0,
        mode: CacheMode = CacheMode.default_on,
    ) -> None:
        self.ledger = LedgerLookup(
            ledger_url, token, pool=pool, fingerprint_id=fingerprint_id, timeout=timeout
        )
        self._requests = _Recent()  # handle -> (endpoint, body)
        super().__init__(
            _backend=_LedgerBackend(self),
            mode=mode,
            max_messages=None,
            supported_call_types=list(SUPPORTED_CALL_TYPES),
        )

    def kept(self, handle: str) -> tuple[str, dict[str, Any]] | None:
        """The (endpoint, body) a handle from :meth:`get_cache_key` stands for."""
        found: tuple[str, dict[str, Any]] | None = self._requests.get(handle)
        return found

    def get_cache_key(self, **kwargs: Any) -> str:
        # Rebuilt from these arguments every time, never looked up by litellm_call_id: an
        # application may pass one trace ID to several calls, and each call is its own body.
        rebuilt = self.request_for(**kwargs)
        if rebuilt is None:
            handle = f"ledger:none:{uuid.uuid4().hex}"  # never kept: the backend misses
        else:
            try:
                digest = hashlib.sha256(canonicalize(list(rebuilt))).hexdigest()
            except InvalidInput as exc:  # NaN, a huge integer: no key the ledger could make
                LOG.debug("ledger cache: the request is not canonical JSON (%s)", exc)
                digest = None
            if digest is None:
                handle = f"ledger:none:{uuid.uuid4().hex}"
            else:
                handle = f"ledger:{digest}"
                self._requests.put(handle, rebuilt)
        return handle

    def request_for(self, **kwargs: Any) -> tuple[str, dict[str, Any]] | None:
        """The (endpoint, JSON body) LiteLLM sends for a ``completion`` or ``text_completion``
        call with these keyword arguments; None when it is not one the ledger can answer."""
        if kwargs.get("text_completion") is True:
            return None
        if "messages" in kwargs:
            call_type = CallTypes.completion
        elif "prompt" in kwargs:
            call_type = CallTypes.text_completion
        else:
            return None
        try:
            _, provider, _, _ = litellm.get_llm_provider(
                model=str(kwargs.get("model")),
                custom_llm_provider=kwargs.get("custom_llm_provider"),
                api_base=kwargs.get("api_base"),
            )
        except Exception as exc:  # LiteLLM's own BadRequestError for an unknown provider
            LOG.debug("ledger cache: no provider for %r (%s)", kwargs.get("model"), exc)
            return None
        if provider not in OPENAI_COMPATIBLE:
            LOG.debug("ledger cache: provider %s is not OpenAI-compatible HTTP", provider)
            return None
        call = {k: v for k, v in kwargs.items() if k not in _INTERNAL}
        call["caching"] = False  # the rebuilt call must not ask this cache again
        try:
            raw = _raw_request(call_type, call)
        except Exception as exc:  # LiteLLM returns its errors; anything else: a miss
            LOG.warning("ledger cache: LiteLLM could not build the request (%s)", exc)
            return None
        body = raw.get("raw_request_body")
        if not isinstance(body, dict):
            LOG.debug("ledger cache: LiteLLM built no request (%s)", raw.get("error"))
            return None
        body = wire_body(body)
        if body is None:
            return None
        if "messages" in body and call_type == CallTypes.completion:
            return CHAT, body
        if "prompt" in body and call_type == CallTypes.text_completion:
            return COMPLETIONS, body
        return None


def _raw_request(call_type: CallTypes, call: dict[str, Any]) -> dict[str, Any]:
    """LiteLLM's request for a call, without sending it. ``return_raw_request`` ends the call
    with an exception that LiteLLM's exception mapper announces on stdout unless
    ``suppress_debug_info``: set for the call (the lock keeps concurrent calls from restoring
    it under each other)."""
    with _QUIET:
        before = litellm.suppress_debug_info
        litellm.suppress_debug_info = True
        try:
            raw: dict[str, Any] = dict(return_raw_request(call_type, call))
        finally:
            litellm.suppress_debug_info = before
    return raw
