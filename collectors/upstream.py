"""The collector's HTTP client to its engine (aiohttp): one keep-alive pool per proxy.

Every request a client sends through the collector makes one call here, on the proxy's event
loop; aiohttp's C parser costs about half of httpx's per call (0.6 against 1.35 ms for a
round trip to a no-op server on a 2-core host, docs/PERFORMANCE.md), and that time is on the
request's critical path. Connection failures, timeouts and broken streams raise
:class:`ledger.errors.Unreachable` naming the engine; an HTTP error status is an answer, not
a failure: the caller passes it on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp

from ledger.errors import Unreachable

CONNECT_TIMEOUT = 10.0
# A connection must open within CONNECT_TIMEOUT; a generation may take as long as the engine
# needs (the client that waits for it sets its own limit).
_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT)
_FAILURES = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
# vLLM's server closes a connection left idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE). A pooled
# connection about that old can be closed by the engine just as it is reused, and the request
# then fails before the engine has read it; the pool drops idle connections well before that.
KEEPALIVE = 2.0
_PASSED = frozenset({"allow", "vary"})
# Marks an answer of the collector's for its front (``collectors.own_answers``), which takes
# the mark off before the answer goes out: vLLM's answer, passed on as it came, or one of
# the collector's that asks vLLM nothing (its 502 for an engine that does not answer, its
# 499 to a client gone).
ANSWER_MARK = "x-ledger-answer"
ENGINE = "engine"
UNASKED = "unasked"


@dataclass(frozen=True)
class Answer:
    """A whole response: status, content type, body and the headers a client gets too
    (:func:`passed_on`)."""

    status: int
    content_type: str | None
    body: bytes
    passed: Mapping[str, str] = field(default_factory=dict)


def passed_on(headers: Mapping[str, str]) -> dict[str, str]:
    """The engine's response headers its client gets through the collector too: a 405's
    ``Allow``, and the CORS answer (``Access-Control-*``, ``Vary``) of vLLM's CORS middleware,
    so a browser is allowed (or refused) what vLLM alone would allow it; marked as vLLM's
    (``ANSWER_MARK``: the collector's front takes the mark off)."""
    passed: dict[str, str] = {ANSWER_MARK: ENGINE}
    for name, value in headers.items():
        key = name.lower()
        if key in _PASSED or key.startswith("access-control-"):
            # each of these is a list: one sent twice is one with both values
            passed[key] = f"{passed[key]}, {value}" if key in passed else value
    return passed


class Streamed:
    """A response being read: status and content type now, the body as lines or at once."""

    def __init__(self, response: aiohttp.ClientResponse, upstream: Upstream) -> None:
        self._response = response
        self._upstream = upstream
        self.status = response.status
        self.content_type = response.headers.get("Content-Type")
        self.passed = passed_on(response.headers)

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except _FAILURES as exc:
            raise self._upstream.unreachable(exc) from exc

    async def lines(self) -> AsyncIterator[list[bytes]]:
        """The body split at line ends (``\\n``, ``\\r\\n``), as server-sent events need:
        the complete lines of each read from the engine, together (a busy engine's events
        arrive several to a read, and are relayed in one write). Lines stay bytes: an event
        passes on as it came, and a chunk is parsed from its UTF-8 bytes."""
        pending = b""
        try:
            async for chunk in self._response.content.iter_any():
                pending += chunk
                *complete, pending = pending.split(b"\n")
                if complete:
                    yield [line.removesuffix(b"\r") for line in complete]
        except _FAILURES as exc:
            raise self._upstream.unreachable(exc) from exc
        if pending:
            yield [pending.removesuffix(b"\r")]


class Upstream:
    """Calls to one engine. Open it on the event loop that uses it (:meth:`open`)."""

    def __init__(self, engine_url: str) -> None:
        self.engine_url = engine_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=256, keepalive_timeout=KEEPALIVE)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=_TIMEOUT,
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def unreachable(self, exc: BaseException) -> Unreachable:
        return Unreachable(
            f"the engine at {self.engine_url} does not answer: {exc!r}", code="engine_unreachable"
        )

    async def _send(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str] | None
    ) -> aiohttp.ClientResponse:
        """Send a request; once more if the engine closed the connection before answering.

        A server that closes a keep-alive connection as it is reused has not read the
        request; one that closes it without answering a request it read has failed it, which
        a client would retry too. Either way nothing was answered, so sending the request
        again on another connection changes nothing a client sees. An engine that cannot be
        connected to, a timeout or a second failure raise :class:`Unreachable`.
        """
        session = self._open_session()
        url = self.engine_url + path
        try:
            return await session.request(method, url, data=body, headers=headers)
        except _FAILURES as exc:
            if not _closed_by_engine(exc):
                raise self.unreachable(exc) from exc
        try:
            return await session.request(method, url, data=body, headers=headers)
        except _FAILURES as exc:
            raise self.unreachable(exc) from exc

    def _open_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Upstream.open() was not awaited")
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """One whole request and response."""
        async with self.stream(method, path, body=body, headers=headers) as response:
            body = await response.read()
            return Answer(response.status, response.content_type, body, response.passed)

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Streamed]:
        """A response to read as it arrives. Leaving the block early (a client gone away)
        closes the connection, which tells the engine to stop generating."""
        response = await self._send(method, path, body, headers)
        try:
            yield Streamed(response, self)
        finally:
            if response.content.at_eof():
                response.release()  # read to the end: the connection goes back to the pool
            else:
                response.close()


def _closed_by_engine(exc: BaseException) -> bool:
    """The engine closed an open connection before its answer began (not: no connection)."""
    return isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError) and not (
        isinstance(exc, aiohttp.ClientConnectorError)
    )
