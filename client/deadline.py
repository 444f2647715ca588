"""A deadline for a whole HTTP request, however slowly the server sends, reads or answers.

httpx's timeouts bound each network operation (connecting, one read, one write), not a
request: a server, or a proxy in front of it, that sends a byte of its answer every few
seconds, or takes the body and then keeps the connection alive with trickles, holds a request
open for good. A client over :class:`DeadlineTransport` bounds every operation of a request
sent :func:`within` a deadline by the time left as well, so that the request fails with
httpx's timeout error (``httpx.TimeoutException``; its connection is closed, never reused)
once the deadline passes. Outside :func:`within` the transport is httpx's own.

The deadline covers connecting (not the name lookup), the TLS handshake, sending the request
(each send on the socket, so a server that reads the body slowly meets it too) and reading the
whole answer. Like ``api.workers_client.GuardedTransport``, the transport takes no proxy from
the environment (``HTTPS_PROXY`` and the like).
"""

from __future__ import annotations

import socket
import ssl
import time
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import httpcore
import httpx

# When the request being sent in this thread (sync httpx sends in the caller's thread) must
# be done by, on the monotonic clock; None: no deadline.
_DEADLINE: ContextVar[float | None] = ContextVar("request_deadline", default=None)
_PIECE = 64 * 1024  # bytes written at once through a stream that is not httpcore's own


@contextmanager
def within(seconds: float | None) -> Iterator[None]:
    """Requests sent in this block over a :class:`DeadlineTransport` must be done within
    ``seconds`` of its start, all of them together (None: no deadline)."""
    if seconds is None:
        yield
        return
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _left(timeout: float | None, late: type[httpcore.TimeoutException]) -> float | None:
    """The timeout for the next operation: ``timeout``, or the time left if that is less;
    raises ``late`` when the deadline has passed."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise late("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if _DEADLINE.get() is None:
            self._inner.write(buffer, timeout)
            return
        # Send by send, as httpcore's stream does, each bounded by the time left: httpcore
        # hands over a whole body in one write, which a server that reads slowly (each send
        # going through before the timeout) would otherwise keep going past the deadline.
        # Only on httpcore's own stream, whose socket is the connection (a plain or a TLS
        # socket); any other (TLS inside a proxy's TLS tunnel: its "socket" is the tunnel's)
        # gets the buffer in pieces through its own write.
        view = memoryview(buffer)
        if type(self._inner).__name__ != "SyncStream":
            while view:
                self._inner.write(bytes(view[:_PIECE]), _left(timeout, httpcore.WriteTimeout))
                view = view[_PIECE:]
            return
        sock: socket.socket = self._inner.get_extra_info("socket")
        while view:
            left = _left(timeout, httpcore.WriteTimeout)
            try:
                sock.settimeout(left)
                view = view[sock.send(view) :]
            except TimeoutError as exc:
                raise httpcore.WriteTimeout(str(exc)) from exc
            except OSError as exc:
                raise httpcore.WriteError(str(exc)) from exc

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's network backend, its streams bounded by the deadline of :func:`within`."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(
            self._inner.connect_tcp(
                host, port, timeout=left, local_address=local_address, socket_options=socket_options
            )
        )

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport over :class:`DeadlineBackend` (httpx takes no backend argument, so
    the connection pool it builds is replaced by one with httpx's default settings and the
    backend, as ``api.workers_client.GuardedTransport`` does)."""

    def __init__(self) -> None:
        super().__init__()
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=100,  # httpx's default limits
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=DeadlineBackend(),
        )
