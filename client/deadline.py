"""A deadline for a whole HTTP request, however slowly the server sends, reads or answers.

httpx's timeouts bound each network operation (connecting, one read, one write), not a
request: a server, or a proxy in front of it, that sends a byte of its answer every few
seconds, or takes the body and then keeps the connection alive with trickles, holds a request
open for good. A client over :class:`DeadlineTransport` bounds every operation of a request
sent :func:`within` a deadline by the time left as well, so that the request fails with
httpx's timeout error (``httpx.TimeoutException``; its connection is closed, never reused)
once the deadline passes. Outside :func:`within` the transport is httpx's own.

The deadline covers the name lookup of the host, connecting (each address it resolves to in
turn, each attempt bounded by the time left, so a host whose addresses all drop connections
cannot take the connect timeout once per address), the TLS handshake, sending the request
(each send on the socket, so a server that reads the body slowly meets it too) and reading the
whole answer. Like ``api.workers_client.GuardedTransport``, the transport takes no proxy from
the environment (``HTTPS_PROXY`` and the like).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import httpcore
import httpx

# When the request being sent in this thread (sync httpx sends in the caller's thread) must
# be done by, on the monotonic clock; None: no deadline.
_DEADLINE: ContextVar[float | None] = ContextVar("request_deadline", default=None)
_PIECE = 64 * 1024  # bytes written at once through a stream that is not httpcore's own

# socket.getaddrinfo's shape, as the backend calls it: (host, port, family, type).
Resolver = Callable[[str, int, int, int], Sequence[tuple[typing.Any, ...]]]


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
    """httpcore's network backend, its name lookups, connection attempts and streams bounded by
    the deadline of :func:`within`. ``resolver`` looks names up (``socket.getaddrinfo``'s
    signature; tests put a slow or a made-up one in its place)."""

    def __init__(self, resolver: Resolver = socket.getaddrinfo) -> None:
        self._inner = httpcore.SyncBackend()
        self._resolver = resolver

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        # What socket.create_connection does, with the lookup and every attempt bounded by the
        # time left: it gives each address the whole timeout, and its lookup has none.
        options = list(socket_options or ())
        failure: Exception | None = None
        for address in self._addresses(host, port):
            left = _left(timeout, httpcore.ConnectTimeout)  # past the deadline: no more tries
            try:
                stream = self._inner.connect_tcp(
                    address,
                    port,
                    timeout=left,
                    local_address=local_address,
                    socket_options=options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
            else:
                return _Stream(stream)
        assert failure is not None  # _addresses returns one address or more
        raise failure

    def _addresses(self, host: str, port: int) -> list[str]:
        """The addresses ``host`` names, in the resolver's order: the lookup is bounded by the
        deadline, not by the connect timeout (httpx's never covers it)."""
        if _is_ip(host):
            return [host]
        answer: list[Sequence[tuple[typing.Any, ...]] | Exception] = []
        done = threading.Event()

        def look_up() -> None:
            try:
                answer.append(self._resolver(host, port, 0, socket.SOCK_STREAM))
            except Exception as exc:
                answer.append(exc)
            finally:
                done.set()

        if _DEADLINE.get() is None:
            look_up()
        else:
            # getaddrinfo cannot be interrupted: it runs in a thread of its own, and a lookup
            # still stuck at the deadline is left to finish (the resolver's own timeouts end
            # it) in a daemon thread, which never holds up the interpreter's exit.
            threading.Thread(target=look_up, name=f"resolve {host}", daemon=True).start()
            while not done.wait(_left(None, httpcore.ConnectTimeout)):
                pass  # woken early: _left raises once the deadline has passed
        result = answer[0]
        if isinstance(result, OSError):
            raise httpcore.ConnectError(str(result)) from result
        if isinstance(result, Exception):
            raise result
        addresses = list(dict.fromkeys(str(info[4][0]) for info in result))
        if not addresses:
            raise httpcore.ConnectError(f"{host} resolves to no address")
        return addresses

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 address may carry a zone
    except ValueError:
        return False
    return True


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport over :class:`DeadlineBackend` (httpx takes no backend argument, so
    the connection pool it builds is replaced by one with httpx's default settings and the
    backend, as ``api.workers_client.GuardedTransport`` does)."""

    def __init__(self, resolver: Resolver = socket.getaddrinfo) -> None:
        super().__init__()
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=100,  # httpx's default limits
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=DeadlineBackend(resolver),
        )
