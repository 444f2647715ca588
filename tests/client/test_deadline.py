"""The deadline transport: its writes through a stream that is not httpcore's own (TLS inside
a proxy's TLS tunnel, whose ``socket`` is the tunnel's) go through the stream's own write, in
pieces each bounded by the time left, never on the socket underneath; and the deadline bounds
the name lookup and every connection attempt, on real sockets with a resolver put in place of
``socket.getaddrinfo``."""

from __future__ import annotations

import functools
import http.server
import json
import socket
import threading
import time
import typing
from collections.abc import Iterator

import httpcore
import pytest

from client import ledger_client
from client.deadline import _PIECE, DeadlineTransport, Resolver, _Stream, within
from client.ledger_client import LedgerClient
from ledger.errors import Pushback

# How far past its deadline a request may end on a busy machine; what the deadline fixes ends
# a multiple of the deadline later (never, or once per address).
DEADLINE = 1.0
MARGIN = 2.0


class Tunnel(httpcore.NetworkStream):
    """A stream of another kind over httpcore's own, as httpcore's TLS-in-TLS stream is: its
    ``socket`` is the one underneath, which must never be written to directly."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self.inner = inner
        self.writes: list[int] = []

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.writes.append(len(buffer))
        self.inner.write(buffer, timeout)

    def close(self) -> None:
        self.inner.close()

    def get_extra_info(self, info: str) -> typing.Any:
        return self.inner.get_extra_info(info)


@pytest.fixture
def received() -> typing.Iterator[tuple[int, bytearray, threading.Event]]:
    listener = socket.create_server(("127.0.0.1", 0))
    got = bytearray()
    closed = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            while chunk := conn.recv(65536):
                got.extend(chunk)
        closed.set()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1], got, closed
    finally:
        listener.close()


def test_a_stream_of_another_kind_is_written_through_in_pieces(received):
    port, got, closed = received
    tunnel = Tunnel(httpcore.SyncBackend().connect_tcp("127.0.0.1", port))
    stream = _Stream(tunnel)
    data = bytes(range(256)) * 1200  # 300 KiB
    with within(30):
        stream.write(data, timeout=10)
    stream.close()
    assert closed.wait(10)
    assert bytes(got) == data
    assert sum(tunnel.writes) == len(data)
    assert len(tunnel.writes) > 1 and max(tunnel.writes) <= _PIECE


def test_past_the_deadline_nothing_more_is_written(received):
    port, got, closed = received
    tunnel = Tunnel(httpcore.SyncBackend().connect_tcp("127.0.0.1", port))
    stream = _Stream(tunnel)
    with within(0), pytest.raises(httpcore.WriteTimeout):
        stream.write(b"x" * 1000, timeout=10)
    stream.close()
    assert closed.wait(10)
    assert tunnel.writes == [] and bytes(got) == b""


class Resolving:
    """A resolver naming ``addresses``, as getaddrinfo answers for a stream socket."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses
        self.asked: list[tuple[str, int]] = []

    def __call__(
        self, host: str, port: int, family: int, kind: int
    ) -> list[tuple[typing.Any, ...]]:
        self.asked.append((host, port))
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in self.addresses]


def client_over(monkeypatch: pytest.MonkeyPatch, resolver: Resolver, port: int) -> LedgerClient:
    """A client with a deadline for ``http://ledger.test:port``, its names looked up by
    ``resolver``."""
    monkeypatch.setattr(
        ledger_client, "DeadlineTransport", functools.partial(DeadlineTransport, resolver)
    )
    return LedgerClient(f"http://ledger.test:{port}", "t", deadline=DEADLINE)


def too_slow(client: LedgerClient) -> float:
    """How long ``client``'s request took to fail with ``ledger_too_slow``."""
    started = time.monotonic()
    with client, pytest.raises(Pushback) as err:
        client.list_keys()
    elapsed = time.monotonic() - started
    assert err.value.code == "ledger_too_slow", err.value.message
    return elapsed


def test_a_name_lookup_that_hangs_is_cut_at_the_deadline(monkeypatch):
    """getaddrinfo stuck on a DNS server that does not answer: the lookup has no timeout of
    httpx's, so without the deadline around it the request waits as long as the resolver."""
    release = threading.Event()
    asked = threading.Event()

    def hang(host: str, port: int, family: int, kind: int) -> list[tuple[typing.Any, ...]]:
        asked.set()
        release.wait(10)  # then fail: never hang a broken run for good
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    try:
        elapsed = too_slow(client_over(monkeypatch, hang, 8700))
    finally:
        release.set()  # ends the lookup's thread
    assert asked.is_set()
    assert DEADLINE <= elapsed < DEADLINE + MARGIN, elapsed


@pytest.fixture
def full_listeners() -> Iterator[tuple[int, list[str]]]:
    """A port listened on at four loopback addresses, each listener's accept queue full, so
    the kernel drops every new SYN there and a connection attempt waits out its timeout (as at
    a blackholed address). Linux: a listen backlog of 0 takes one connection."""
    addresses = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    for _ in range(20):  # another program may hold the port at one of the addresses
        sockets: list[socket.socket] = []
        try:
            port = 0
            for address in addresses:
                listener = socket.socket()
                sockets.append(listener)
                listener.bind((address, port))
                listener.listen(0)
                port = listener.getsockname()[1]
                for _ in range(8):
                    probe = socket.socket()
                    probe.settimeout(0.2)
                    try:
                        probe.connect((address, port))
                    except TimeoutError:
                        probe.close()
                        break
                    sockets.append(probe)  # held in the accept queue, filling it
                else:
                    pytest.fail(f"the accept queue at {address}:{port} never filled")
        except OSError:
            for sock in sockets:
                sock.close()
            continue
        try:
            yield port, addresses
        finally:
            for sock in sockets:
                sock.close()
        return
    pytest.fail("no port free at all four loopback addresses")


def test_a_host_whose_addresses_all_drop_connections_is_cut_at_the_deadline(
    monkeypatch, full_listeners
):
    """Four addresses, none answering a SYN: each attempt gets the time left, not the time
    left when connecting began (which would take the deadline four times over)."""
    port, addresses = full_listeners
    resolver = Resolving(*addresses)
    elapsed = too_slow(client_over(monkeypatch, resolver, port))
    assert resolver.asked == [("ledger.test", port)]
    assert DEADLINE <= elapsed < DEADLINE + MARGIN, elapsed


def test_a_name_is_looked_up_and_its_addresses_tried_in_turn(monkeypatch):
    """The ordinary path: the first address refuses the connection, the next one answers."""

    class Ledger(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"items": [{"path": self.path, "host": self.headers["host"]}]})
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: typing.Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ledger)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    resolver = Resolving("127.0.0.2", "127.0.0.1")  # nothing listens at the first
    try:
        with client_over(monkeypatch, resolver, port) as client:
            items = client.list_keys()
    finally:
        server.shutdown()
        server.server_close()
    assert items == [{"path": "/v1/keys", "host": f"ledger.test:{port}"}]
    assert resolver.asked == [("ledger.test", port)]


def test_a_name_that_does_not_resolve_is_unreachable_not_too_slow(monkeypatch):
    def unknown(host: str, port: int, family: int, kind: int) -> list[tuple[typing.Any, ...]]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with client_over(monkeypatch, unknown, 8700) as client, pytest.raises(Pushback) as err:
        client.list_keys()
    assert err.value.code == "ledger_unreachable"
    assert "Name or service not known" in err.value.message
