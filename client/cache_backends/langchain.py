"""A LangChain cache answered by the ledger: :class:`LedgerCache`.

    from client.cache_backends.langchain import LedgerCache
    llm = ChatOpenAI(base_url=COLLECTOR, model="fixture", temperature=0,
                     cache=LedgerCache(LEDGER, token, pool="strict"))

LangChain asks a cache with two strings, ``prompt`` and ``llm_string``; the cache rebuilds from
them the exact OpenAI request the model would send, asks the ledger (``POST
/v1/cache/lookup``) and turns a hit into generations. It stores nothing: the collector in front
of vLLM records every answer, so ``update`` and ``clear`` do nothing.

What the two strings carry (langchain-core 1.8, langchain-openai 1.7), and so what is rebuilt:

- a chat model (``ChatOpenAI``): ``prompt`` is ``dumps(messages)``; ``llm_string`` is the
  model's serialized constructor arguments (every field that differs from its default), then
  ``---``, then the call's keyword arguments (``stop``, anything bound with ``bind`` or
  ``bind_tools``) as a Python literal. The model is rebuilt from those arguments and asked for
  its own payload (``_get_request_payload``): the body is what the ``openai`` SDK sends for it
  (``extra_body`` merged in).
- a completion LLM (``langchain_openai.OpenAI``): ``prompt`` is the text; ``llm_string`` is the
  model's identifying parameters (model name, every sampling parameter, ``model_kwargs``
  merged) and ``stop``. The body is ``{"model", ...parameters, "stop", "prompt"}``. The library
  sends ``"prompt": [text]`` (a batch of one); the lookup asks with ``"prompt": text``, which
  vLLM answers identically, because the ``ck1`` key takes one prompt, not a list.

What cannot be carried, so a miss (``None``), never a guess:

- any model class but ``ChatOpenAI`` and ``OpenAI`` (their Azure subclasses too), a model
  routed to the Responses API, a ``response_format`` (structured output: LangChain
  parses it from the SDK's ``parsed`` field, which a cached message does not have), an
  ``llm_string`` that does not parse, a value the model cannot be rebuilt with;
- a completion LLM's per-call keyword arguments (``llm.invoke(text, temperature=0.9)``):
  LangChain leaves them out of ``llm_string``, so the cache cannot see them and would look up
  the model's own parameters, and a hit could answer another request. Completion LLMs are
  therefore looked up only with ``LedgerCache(..., completion_llms=True)``, by an application
  that sets every parameter on the model and never per call. (Chat models carry them.)

A ledger that cannot answer (network down, a wrong token, a pool with no live worker) is a
miss with a warning on the ``client.cache_backends`` logger: the application goes on to the
model.
"""

from __future__ import annotations

import ast
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core._api import suppress_langchain_beta_warning
from langchain_core.caches import RETURN_VAL_TYPE, BaseCache
from langchain_core.load import loads
from langchain_core.messages import AIMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, Generation
from langchain_openai import ChatOpenAI

from client.cache_backends.lookup import (
    CHAT,
    COMPLETIONS,
    LOG,
    Answer,
    LedgerLookup,
    wire_body,
)

CHAT_OPENAI_ID = ["langchain", "chat_models", "openai", "ChatOpenAI"]
# The completion LLM's ``_llm_type``: langchain_openai.OpenAI
OPENAI_LLM_TYPE = "openai"
# A rebuilt model stands in for its key: the secret is never read (no request is sent)
_UNUSED_KEY = "unused-by-the-ledger-cache"
_MODELS_KEPT = 64


@dataclass(frozen=True)
class Rebuilt:
    """The request a LangChain model sends for one prompt: ``chat`` says which generations a
    hit becomes."""

    endpoint: str
    request: dict[str, Any]

    @property
    def chat(self) -> bool:
        return self.endpoint == CHAT


def _literal(text: str) -> dict[str, Any] | None:
    """``str(sorted(params.items()))`` back to a dict; None when it is no such literal."""
    try:
        pairs = ast.literal_eval(text)
        params = dict(pairs)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return params if all(isinstance(k, str) for k in params) else None


def _constructor_kwargs(serialized: dict[str, Any]) -> dict[str, Any] | None:
    """The serialized model's constructor arguments, the secret replaced; None when one is
    an object the serialization could not carry."""
    kwargs = serialized.get("kwargs")
    if not isinstance(kwargs, dict):
        return None
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        if isinstance(value, dict) and value.get("lc") == 1:
            if value.get("type") != "secret":
                return None  # a nested object (not_implemented or a constructor)
            value = _UNUSED_KEY
        out[name] = value
    out.setdefault("openai_api_key", _UNUSED_KEY)
    return out


class LedgerCache(BaseCache):
    """A LangChain cache whose answers are the ledger's recorded vLLM answers, keyed under
    ``pool`` (the fingerprint its live workers serve) or ``fingerprint_id``."""

    def __init__(
        self,
        ledger_url: str,
        token: str,
        *,
        pool: str | None = None,
        fingerprint_id: str | None = None,
        timeout: float = 10.0,
        completion_llms: bool = False,
    ) -> None:
        # Off by default: a completion LLM's per-call arguments are not in what LangChain
        # gives a cache (module docstring), so a hit could answer another request.
        self.completion_llms = completion_llms
        self.ledger = LedgerLookup(
            ledger_url, token, pool=pool, fingerprint_id=fingerprint_id, timeout=timeout
        )
        self._models: OrderedDict[str, ChatOpenAI] = OrderedDict()
        self._lock = threading.Lock()

    # -- BaseCache ------------------------------------------------------------------------

    def lookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        rebuilt = self.request_for(prompt, llm_string)
        if rebuilt is None:
            return None
        return _generations(rebuilt, self.ledger.lookup(rebuilt.endpoint, rebuilt.request))

    async def alookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        rebuilt = self.request_for(prompt, llm_string)
        if rebuilt is None:
            return None
        return _generations(rebuilt, await self.ledger.alookup(rebuilt.endpoint, rebuilt.request))

    def update(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        """Nothing to store: the collector records every answer."""

    async def aupdate(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        """Nothing to store: the collector records every answer."""

    def clear(self, **kwargs: Any) -> None:
        """Nothing to clear: the ledger's log is append-only."""

    async def aclear(self, **kwargs: Any) -> None:
        """Nothing to clear: the ledger's log is append-only."""

    # -- the request ----------------------------------------------------------------------

    def request_for(self, prompt: str, llm_string: str) -> Rebuilt | None:
        """The OpenAI request the model behind ``llm_string`` sends for ``prompt``; None when
        the strings do not say it exactly (see the module)."""
        try:
            if llm_string.startswith("{"):
                return self._chat_request(prompt, llm_string)
            if llm_string.startswith("[") and self.completion_llms:
                return _completion_request(prompt, llm_string)
        except Exception as exc:  # a library that changed shape: a miss, never a crash
            LOG.warning("ledger cache: cannot rebuild the request (%s: %s)", type(exc), exc)
        return None

    def _chat_request(self, prompt: str, llm_string: str) -> Rebuilt | None:
        try:
            serialized, end = json.JSONDecoder().raw_decode(llm_string)
        except ValueError:
            return None
        params = _literal(llm_string[end + 3 :]) if llm_string[end:].startswith("---") else None
        if not isinstance(serialized, dict) or params is None:
            return None
        if serialized.get("id") != CHAT_OPENAI_ID:
            LOG.debug("ledger cache: no request rebuilt for %s", serialized.get("id"))
            return None
        model = self._model(llm_string[:end], serialized)
        if model is None or "response_format" in params:
            return None
        if model._use_responses_api({**model._default_params, **params}):
            return None
        with suppress_langchain_beta_warning():  # as LangChain calls its own beta functions
            messages = loads(prompt, allowed_objects="messages")
        if not isinstance(messages, list):
            return None
        stop = params.pop("stop", None)
        payload = model._get_request_payload(messages, stop=stop, **params)
        if "response_format" in payload or "messages" not in payload:
            return None
        body = wire_body(payload)
        return None if body is None else Rebuilt(CHAT, body)

    def _model(self, text: str, serialized: dict[str, Any]) -> ChatOpenAI | None:
        with self._lock:
            model = self._models.get(text)
            if model is not None:
                self._models.move_to_end(text)
                return model
        kwargs = _constructor_kwargs(serialized)
        if kwargs is None:
            return None
        try:
            model = ChatOpenAI(**kwargs)
        except Exception as exc:  # validation: a value this version does not take
            LOG.debug("ledger cache: cannot rebuild ChatOpenAI (%s)", exc)
            return None
        with self._lock:
            self._models[text] = model
            while len(self._models) > _MODELS_KEPT:
                self._models.popitem(last=False)
        return model


def _completion_request(prompt: str, llm_string: str) -> Rebuilt | None:
    params = _literal(llm_string)
    if params is None or params.pop("_type", None) != OPENAI_LLM_TYPE:
        return None
    model = params.pop("model_name", None)
    stop = params.pop("stop", None)
    request: dict[str, Any] = {"model": model, **params}
    if stop is not None:
        request["stop"] = stop
    request["prompt"] = prompt
    body = wire_body(request)
    return None if body is None or not isinstance(model, str) else Rebuilt(COMPLETIONS, body)


def _usage(response: dict[str, Any]) -> UsageMetadata | None:
    usage = response.get("usage")
    if not isinstance(usage, dict):
        return None
    try:
        return UsageMetadata(
            input_tokens=int(usage["prompt_tokens"]),
            output_tokens=int(usage["completion_tokens"]),
            total_tokens=int(usage["total_tokens"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _generations(rebuilt: Rebuilt, answer: Answer) -> Sequence[Generation] | None:
    """A hit as LangChain's generations; None for a miss or an answer that does not read as
    one (logged: the call goes on to the model)."""
    if not answer.hit or answer.response is None:
        return None
    try:
        return _read(rebuilt, answer, answer.response)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        LOG.warning("ledger cache: the hit does not read as a response (%s: %s)", type(exc), exc)
        return None


def _read(rebuilt: Rebuilt, answer: Answer, response: dict[str, Any]) -> list[Generation] | None:
    choices = sorted(response["choices"], key=lambda c: int(c.get("index", 0)))
    info_common = {"ledger": answer.evidence(), "model_name": response.get("model")}
    generations: list[Generation] = []
    for choice in choices:
        info = {**info_common, "finish_reason": choice.get("finish_reason")}
        if rebuilt.chat:
            content = (choice.get("message") or {}).get("content")
            if not isinstance(content, str):
                return None
            message = AIMessage(
                content=content,
                response_metadata={
                    **info,
                    "system_fingerprint": response.get("system_fingerprint"),
                    "id": response.get("id"),
                },
                usage_metadata=_usage(response) if len(choices) == 1 else None,
            )
            generations.append(ChatGeneration(message=message, generation_info=info))
        else:
            text = choice.get("text")
            if not isinstance(text, str):
                return None
            generations.append(
                Generation(text=text, generation_info={**info, "logprobs": choice.get("logprobs")})
            )
    return generations
