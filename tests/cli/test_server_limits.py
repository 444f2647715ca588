"""``ledger serve``'s uvicorn limits (cli/serve.py, api/server_protocol.py) over real sockets:
request headers have a deadline and a size limit, which uvicorn alone does not have. The
ledger app is served by a second uvicorn server with ``SERVER_LIMITS`` (the header deadline
shortened to keep the test quick); the harness's own server, plain uvicorn, is the control."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import uvicorn

from api.server_protocol import MAX_HEADER_BYTES, HeaderTimeoutProtocol
from cli.serve import SERVER_LIMITS
from demo.server_thread import free_port
from tests.support.harness import Harness

DEADLINE = 0.5


class QuickHeaders(HeaderTimeoutProtocol):
    header_timeout = DEADLINE


@pytest.fixture
def limited(api: Harness) -> Iterator[str]:
    """The harness's app behind uvicorn configured as ``ledger serve`` configures it."""
    options = {**SERVER_LIMITS, "http": QuickHeaders}
    port = free_port()
    config = uvicorn.Config(
        api.server.server.config.app, "127.0.0.1", port, log_level="warning", lifespan="off"
    )
    for name, value in options.items():
        setattr(config, name, value)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    assert parts.hostname and parts.port
    return socket.create_connection((parts.hostname, parts.port), timeout=5)


def _read_all(sock: socket.socket, wait: float) -> tuple[bytes, bool]:
    """What the server sends within ``wait`` seconds, and whether it closed."""
    sock.settimeout(wait)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data, False
    except ConnectionResetError:
        pass
    return data, True


def _code(answer: bytes) -> str:
    code: str = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"]
    return code


def test_uvicorn_alone_holds_a_silent_connection(api: Harness):
    with _connect(api.url) as sock:  # the control: why the protocol exists
        data, closed = _read_all(sock, 3 * DEADLINE)
    assert data == b"" and not closed


def test_a_silent_connection_is_closed_after_the_header_deadline(limited: str):
    with _connect(limited) as sock:
        start = time.monotonic()
        data, closed = _read_all(sock, 10)
    assert closed and data.startswith(b"HTTP/1.1 408 ") and _code(data) == "header_timeout"
    assert DEADLINE - 0.1 < time.monotonic() - start < DEADLINE + 5  # 5: a loaded host


def test_trickled_headers_are_cut_off(limited: str):
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100 + b"\r\n\r\n"
    with _connect(limited) as sock:
        start = time.monotonic()
        for i in range(len(request)):
            try:
                sock.sendall(request[i : i + 1])
            except OSError:
                break
            time.sleep(0.05)
            if time.monotonic() - start > DEADLINE + 1:
                break
        data, closed = _read_all(sock, 5)
    assert closed and b" 408 " in data.split(b"\r\n")[0] and _code(data) == "header_timeout"


def test_oversized_headers_are_refused(api: Harness, limited: str):
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (4 * MAX_HEADER_BYTES)
    with _connect(api.url) as control:  # plain uvicorn takes any size
        control.sendall(big + b"\r\n\r\n")
        data, _ = _read_all(control, 2)
        assert data.startswith(b"HTTP/1.1 200 ")
    with _connect(limited) as sock:
        with contextlib.suppress(OSError):  # the server may stop reading before the end
            sock.sendall(big)
        data, closed = _read_all(sock, 5)
    assert closed and data.startswith(b"HTTP/1.1 431 ") and _code(data) == "headers_too_large"


def test_kept_alive_connections_and_large_bodies_still_work(api: Harness, limited: str):
    with _connect(limited) as sock:
        for _ in range(2):  # the second request comes after the header deadline: no matter
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.settimeout(5)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            time.sleep(2 * DEADLINE)
    # headers and a large body in one write: only header bytes count against the limit
    key, fp = api.setup_collector()
    body = json.dumps({"envelopes": [api.record(key, fp, out_len=20_000).to_dict()]}).encode()
    assert len(body) > 2 * MAX_HEADER_BYTES
    head = (
        f"POST /v1/records HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api.admin_token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with _connect(limited) as sock:
        sock.sendall(head.encode() + body)
        data, _ = _read_all(sock, 3)
    assert data.startswith(b"HTTP/1.1 201 "), data[:300]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"FOO /v1/keys HTTP/1.1\r\nhost: x\r\n\r\n",
        b"POST /v1/keys HTTP/1.1\r\nhost: x\r\ncontent-length: 1_4\r\n\r\n",
        b"POST /v1/keys HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n",
        b"GET /v1/\xff HTTP/1.1\r\nhost: x\r\n\r\n",
    ],
    ids=["unknown-method", "odd-length", "two-lengths", "raw-byte"],
)
def test_a_request_that_is_not_http_gets_the_json_error_shape(limited: str, request_bytes: bytes):
    """uvicorn answers these in plain text; ``ledger serve`` in the shape of every answer."""
    with _connect(limited) as sock:
        sock.sendall(request_bytes)
        data, closed = _read_all(sock, 5)
    assert closed and data.startswith(b"HTTP/1.1 400 "), data
    assert b"application/json" in data.partition(b"\r\n\r\n")[0]
    assert _code(data) == "invalid_http"
