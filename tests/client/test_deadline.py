"""The deadline transport's writes through a stream that is not httpcore's own (TLS inside a
proxy's TLS tunnel, whose ``socket`` is the tunnel's): through the stream's own write, in
pieces each bounded by the time left, never on the socket underneath."""

from __future__ import annotations

import socket
import threading
import typing

import httpcore
import pytest

from client.deadline import _PIECE, _Stream, within


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
