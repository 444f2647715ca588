"""One cache lookup against the ledger, ``POST /v1/cache/lookup``, for the cache backends.

:class:`LedgerLookup` sends an OpenAI request (as the client would send it to vLLM) with the
pool or fingerprint it keys under, and answers an :class:`Answer`: a hit with vLLM's answer
and the evidence (request ID, log index, ``ck1`` key), or a miss with the ledger's reason. It
never raises for what the ledger or the network does: a cache must not break the application,
so a ledger that cannot answer (down, 401, 409 ``no_live_worker``, a request it cannot key) is
a miss with reason ``error``, logged as a warning on the ``client.cache_backends`` logger.
``timeout`` bounds a whole lookup, however slowly the ledger (or a proxy in front of it)
answers; lookups take no proxy from the environment (``client.deadline``). A token that is not
a bearer token is refused when the lookup is made, never quoted.

Two checks on the client's side, so a hit is never the wrong answer:

- ``stream`` and ``stream_options`` only say how an answer is delivered (the key ignores them):
  the lookup asks without them, so a hit is always JSON, and the library streams it itself;
- a hit whose response names another model than the request did is a miss (``model_mismatch``):
  the key leaves the model name to the fingerprint, so such a hit means the cache is pointed at
  a pool that does not serve the model the application asks for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass
from typing import Any

import httpx

from client.deadline import DeadlineTransport, within
from client.ledger_client import check_token
from ledger.errors import InvalidInput

LOG = logging.getLogger("client.cache_backends")
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
DELIVERY_ONLY = ("stream", "stream_options")


@dataclass(frozen=True)
class Answer:
    """A lookup's outcome. A hit has ``response`` (vLLM's answer, OpenAI-compatible) and the
    evidence; a miss has ``reason`` (the ledger's, or ``error`` / ``model_mismatch``)."""

    hit: bool
    reason: str | None = None
    message: str = ""
    key: str | None = None
    fingerprint_id: str | None = None
    request_id: str | None = None
    log_index: int | None = None
    response: dict[str, Any] | None = None

    def evidence(self) -> dict[str, Any]:
        """Where a hit came from, for a generation's metadata."""
        return {
            "request_id": self.request_id,
            "log_index": self.log_index,
            "key": self.key,
            "fingerprint_id": self.fingerprint_id,
        }


def _miss(reason: str, message: str, **kw: Any) -> Answer:
    log = LOG.warning if reason == "error" else LOG.debug
    log("ledger cache miss (%s): %s", reason, message)
    return Answer(False, reason, message, **kw)


class LedgerLookup:
    """Lookups under one pool (the fingerprint its live workers serve) or one fingerprint."""

    def __init__(
        self,
        ledger_url: str,
        token: str,
        *,
        pool: str | None = None,
        fingerprint_id: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        if (pool is None) == (fingerprint_id is None):
            raise InvalidInput(
                "name a pool or a fingerprint_id (one of them)", code="invalid_parameters"
            )
        if type(timeout) not in (int, float) or not 0 < timeout < math.inf:
            raise InvalidInput(
                f"timeout must be a number of seconds above 0, not {timeout!r}: it bounds each "
                "lookup in all",
                code="invalid_parameters",
            )
        self.base_url = ledger_url.rstrip("/")
        self.target: dict[str, str] = (
            {"pool": pool} if pool is not None else {"fingerprint_id": str(fingerprint_id)}
        )
        self._headers = {"Authorization": f"Bearer {check_token(token)}"}
        self._timeout = timeout
        # read once, here (SSL_CERT_FILE, SSL_CERT_DIR): a lookup never fails on building it
        self._tls = httpx.create_ssl_context()
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=self._headers,
            timeout=timeout,
            transport=DeadlineTransport(),  # the timeout bounds each lookup in all
        )

    def close(self) -> None:
        self._http.close()

    def payload(self, endpoint: str, request: dict[str, Any]) -> dict[str, Any]:
        asked = {k: v for k, v in request.items() if k not in DELIVERY_ONLY}
        return {"endpoint": endpoint, "request": asked, **self.target}

    def lookup(self, endpoint: str, request: dict[str, Any]) -> Answer:
        payload = self.payload(endpoint, request)
        try:
            with within(self._timeout):
                response = self._http.post("/v1/cache/lookup", json=payload)
        except httpx.HTTPError as exc:
            return self._unanswered(exc)
        return self._answer(request, response)

    async def alookup(self, endpoint: str, request: dict[str, Any]) -> Answer:
        # One client per call: an AsyncClient belongs to the event loop it was first used in,
        # and an application may run several loops (asyncio.run per task).
        payload = self.payload(endpoint, request)

        async def post() -> httpx.Response:
            async with httpx.AsyncClient(
                base_url=self.base_url,
                headers=self._headers,
                timeout=self._timeout,
                # a transport of its own: no proxy from the environment, as the synchronous
                # lookups; the certificates those read too
                transport=httpx.AsyncHTTPTransport(verify=self._tls),
            ) as http:
                return await http.post("/v1/cache/lookup", json=payload)

        try:
            response = await asyncio.wait_for(post(), self._timeout)
        except (TimeoutError, httpx.HTTPError) as exc:
            return self._unanswered(exc)
        return self._answer(request, response)

    def _unanswered(self, exc: Exception) -> Answer:
        if isinstance(exc, (TimeoutError, httpx.TimeoutException)):
            return _miss(
                "error",
                f"the ledger at {self.base_url} did not answer within {self._timeout:g} s",
            )
        return _miss("error", f"cannot reach the ledger at {self.base_url}: {exc}")

    def _answer(self, request: dict[str, Any], response: httpx.Response) -> Answer:
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code != 200 or not isinstance(data, dict):
            error = data.get("error") if isinstance(data, dict) else None
            if isinstance(error, dict):
                what = f"{error.get('code')}: {error.get('message')}"
            else:
                what = response.text[:200]
            return _miss("error", f"the ledger answered HTTP {response.status_code} ({what})")
        common = {"key": data.get("key"), "fingerprint_id": data.get("fingerprint_id")}
        if data.get("hit") is not True:
            return _miss(str(data.get("reason")), str(data.get("message", "")), **common)
        answer = data.get("response")
        if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
            return _miss("error", "the ledger's hit has no response with choices", **common)
        asked_model = request.get("model")
        if asked_model is not None and answer.get("model") != asked_model:
            return _miss(
                "model_mismatch",
                f"the record answered model {answer.get('model')!r}, the request asks for "
                f"{asked_model!r}: is the cache pointed at the pool that serves it?",
                **common,
            )
        return Answer(
            True,
            key=common["key"],
            fingerprint_id=common["fingerprint_id"],
            request_id=data.get("request_id"),
            log_index=data.get("log_index"),
            response=answer,
        )


def wire_body(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON body the ``openai`` SDK sends for ``create(**payload)``: its request options
    dropped, ``extra_body`` merged into the body (its members win, as in the SDK), and the rest
    as JSON reads it back (``{42: -5}`` is ``{"42": -5}``). None when it is no JSON (an object,
    NaN): the lookup could not send it as the library does."""
    body = {
        k: v
        for k, v in payload.items()
        if k not in ("extra_body", "extra_headers", "extra_query", "timeout")
    }
    extra = payload.get("extra_body")
    if isinstance(extra, dict):
        body.update(extra)
    try:
        read_back = json.loads(json.dumps(body, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return None
    return read_back if isinstance(read_back, dict) else None
