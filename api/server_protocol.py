"""uvicorn's HTTP protocol (httptools) with a deadline and a size limit for request headers.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive``, but a connection
that sends nothing, or sends its request line and headers a byte at a time, it holds forever,
and httptools buffers headers of any size (8 MiB of one header are accepted): a few hundred
such connections use up ``limit_concurrency`` (every new request then gets 503), the
process's file descriptors or its memory. Here each request's headers must be complete

- within ``header_timeout`` seconds of the connection's start, or of the request's first
  byte on a kept-alive connection: else 408 ``header_timeout`` and the connection is closed;
- within ``max_header_bytes``: else 431 ``headers_too_large`` and the connection is closed.

A request httptools cannot parse is answered 400 ``invalid_http`` in the same JSON shape
(uvicorn's own answer is plain text), and the connection is closed.

Bodies have their own limits in the app (LEDGER_MAX_BODY_BYTES, LEDGER_BODY_TIMEOUT:
api/gate.py).
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT = 10.0
MAX_HEADER_BYTES = 64 * 1024


def _answer(status: str, code: str, message: str) -> bytes:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class HeaderTimeoutProtocol(HttpToolsProtocol):
    header_timeout = HEADER_TIMEOUT
    max_header_bytes = MAX_HEADER_BYTES
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_bytes = 0
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _refuse(self, answer: bytes) -> None:
        self._disarm_header_timer()
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:  # never inside another answer
            self.transport.write(answer)
        self.transport.close()

    def _headers_late(self) -> None:
        self._header_timer = None
        self._refuse(
            _answer(
                "408 Request Timeout",
                "header_timeout",
                f"the request headers did not arrive within {self.header_timeout:g} s",
            )
        )

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        in_headers = self._header_timer is not None
        super().data_received(data)
        if in_headers and self._header_timer is not None:  # the headers are still not complete
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._refuse(
                    _answer(
                        "431 Request Header Fields Too Large",
                        "headers_too_large",
                        f"the request line and headers exceed {self.max_header_bytes} bytes",
                    )
                )

    def send_400_response(self, msg: str) -> None:
        """httptools could not parse the request (an unknown method, a malformed or repeated
        Content-Length, a raw byte no URL holds): the JSON error shape, as every answer."""
        self.logger.debug("invalid HTTP request: %s", msg)
        self._refuse(
            _answer(
                "400 Bad Request",
                "invalid_http",
                "the request is not valid HTTP/1.1: its request line or headers do not parse",
            )
        )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header_timer()  # (armed already on a fresh connection: that deadline holds)

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)
