"""Drop-in cache backends answered by the ledger (``POST /v1/cache/lookup``):

- :mod:`client.cache_backends.langchain`: ``LedgerCache``, a LangChain ``BaseCache``;
- :mod:`client.cache_backends.litellm`: ``LedgerLiteLLMCache``, for ``litellm.cache``;
- :mod:`client.cache_backends.lookup`: the lookup both use (httpx only).

Each rebuilds the exact OpenAI request its library sends to vLLM, asks the ledger for the
recorded answer under a pool (or fingerprint), and hands a hit back in the library's own shape.
Nothing is stored by them: the collector in front of vLLM records every answer. A miss, or a
ledger that cannot answer, sends the call on to the model. Import the one you use: this package
does not import LangChain or LiteLLM, so ``import client`` works without them. See
docs/CACHE.md, "Backends".
"""
