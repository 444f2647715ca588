"""HTTP/1.1 over a plain socket, for what an HTTP client library will not do: send a body
slower or shorter than it says, or keep sending while the server has already answered."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: bytes
    sent: int  # body bytes the client had sent when the answer arrived (or it stopped)
    elapsed: float  # seconds from the request's first byte to the answer's first byte
    closed: bool  # the server closed the connection after its answer

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def code(self) -> str:
        code: str = self.json()["error"]["code"]
        return code


def _parse(data: bytes) -> tuple[int, dict[str, str], bytes] | None:
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    if len(rest) < length:
        return None
    return status, headers, rest[:length]


def exchange(
    base_url: str,
    method: str,
    path: str,
    headers: dict[str, str],
    chunks: Iterable[bytes],
    *,
    pause: float = 0.0,
    timeout: float = 30.0,
) -> RawAnswer:
    """Send the request line, ``headers`` and then ``chunks`` one by one (``pause`` seconds
    apart), watching for an answer after each; stop sending as soon as one has arrived.
    Then wait up to ``timeout`` for the whole answer and for the server to close."""
    url = urlsplit(base_url)
    sock = socket.create_connection((url.hostname, url.port), timeout=timeout)
    head = f"{method} {path} HTTP/1.1\r\nHost: {url.hostname}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    start = time.monotonic()
    received, sent = b"", 0
    try:
        sock.sendall(head.encode("latin-1"))
        for chunk in chunks:
            readable, _, _ = select.select([sock], [], [], pause)
            if readable:
                break
            try:
                sock.sendall(chunk)
            except OSError:  # the server closed while we were sending: read its answer
                break
            sent += len(chunk)
        answered_at = None
        deadline = start + timeout
        closed = False
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if answered_at is None and data:
                answered_at = time.monotonic()
            if not data:
                closed = True
                break
            received += data
            if (
                _parse(received) is not None
                and b"close" not in received.split(b"\r\n\r\n")[0].lower()
            ):
                break  # a complete keep-alive answer: do not wait for a close
    finally:
        sock.close()
    parsed = _parse(received)
    if parsed is None:
        raise AssertionError(f"no complete HTTP answer within {timeout} s: {received[:300]!r}")
    status, answer_headers, body = parsed
    elapsed = (answered_at or time.monotonic()) - start
    return RawAnswer(status, answer_headers, body, sent, elapsed, closed)


def flood(size: int, chunk: int = 1 << 16) -> Iterable[bytes]:
    """``size`` bytes of JSON whitespace, ``chunk`` at a time."""
    block = b" " * chunk
    for _ in range(size // chunk):
        yield block


def chunked(pieces: Iterable[bytes]) -> Iterable[bytes]:
    """The pieces in chunked transfer coding (never terminated: the server must stop us)."""
    for piece in pieces:
        yield b"%x\r\n" % len(piece) + piece + b"\r\n"
