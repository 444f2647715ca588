"""A TCP relay between a client and a server that shows what passed each way and who closed.

Tests put it between the collector and its engine to see, without timing anything, what the
collector sent the engine and whether it closed the engine's connection before an answer came;
and, trickling the server's answers a byte at a time, between the shipper and the ledger as a
proxy that answers too slowly.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class RelayedConnection:
    """One connection through the relay."""

    sent: bytearray = field(default_factory=bytearray)  # client -> server
    answered: bytearray = field(default_factory=bytearray)  # server -> relay (-> client)
    closed_by_client: threading.Event = field(default_factory=threading.Event)
    # What the server had answered when the client closed (None while the client has not).
    answered_at_close: bytes | None = None
    # (len(sent), len(answered)) as each chunk from the client arrived.
    marks: list[tuple[int, int]] = field(default_factory=list)

    def answered_at_close_to(self, marker: bytes) -> bytes:
        """What the server answered, once the client closed, after the client began sending
        the chunk that holds ``marker`` (the answer to that request, on a reused connection)."""
        assert self.answered_at_close is not None, "the client has not closed"
        at = bytes(self.sent).find(marker)
        assert at >= 0, "the client never sent the marker"
        answered_then = max(answered for sent, answered in self.marks if sent <= at)
        return self.answered_at_close[answered_then:]

    def sent_whole_request(self, marker: bytes) -> bool:
        """Whether the client sent a whole HTTP/1.1 request (head and ``Content-Length``
        bytes of body) whose head holds ``marker``."""
        sent = bytes(self.sent)
        at = sent.find(marker)
        end = sent.find(b"\r\n\r\n", at)
        if at < 0 or end < 0:
            return False
        start = sent.rfind(b"\r\n\r\n", 0, at)  # the end of an earlier request's head
        head = sent[start + 4 if start >= 0 else 0 : end].lower()
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip() == b"content-length":
                length = int(value)
        return len(sent) >= end + 4 + length


class TcpRelay:
    """Listens on 127.0.0.1 and relays every connection to ``target`` (host, port).

    With ``trickle`` the server's answers reach the client one byte every ``trickle`` seconds,
    from their first byte or, given ``trickle_after``, from where a connection's answers first
    hold it (``b"\r\n\r\n"``: after the first answer's head)."""

    def __init__(
        self, target: tuple[str, int], *, trickle: float | None = None, trickle_after: bytes = b""
    ) -> None:
        self._target = target
        self._trickle = trickle
        self._trickle_after = trickle_after
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._lock = threading.Lock()
        self.connections: list[RelayedConnection] = []
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def wait_for(
        self, found: Callable[[RelayedConnection], bool], timeout: float
    ) -> RelayedConnection:
        """The first connection for which ``found`` holds, waiting up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                hits = [c for c in self.connections if found(c)]
            if hits:
                return hits[0]
            time.sleep(0.01)
        raise AssertionError(f"no connection through the relay matched in {timeout} s")

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(self._target)
                connection = RelayedConnection()
                with self._lock:
                    self.connections.append(connection)
                    self._sockets += [client, server]
                threading.Thread(
                    target=self._upward, args=(client, server, connection), daemon=True
                ).start()
                threading.Thread(
                    target=self._downward, args=(server, client, connection), daemon=True
                ).start()

    def _upward(
        self, client: socket.socket, server: socket.socket, connection: RelayedConnection
    ) -> None:
        for chunk in _chunks(client):
            with self._lock:
                connection.marks.append((len(connection.sent), len(connection.answered)))
                connection.sent += chunk
            with contextlib.suppress(OSError):
                server.sendall(chunk)
        with self._lock:
            connection.answered_at_close = bytes(connection.answered)
        connection.closed_by_client.set()
        with contextlib.suppress(OSError):
            # shutdown, not only close: another thread is reading this socket, and a close
            # alone would not end the connection while that read waits.
            server.shutdown(socket.SHUT_RDWR)
        server.close()  # the server sees its client leave

    def _downward(
        self, server: socket.socket, client: socket.socket, connection: RelayedConnection
    ) -> None:
        marker = self._trickle_after
        for chunk in _chunks(server):
            with self._lock:
                start = len(connection.answered)  # where the chunk begins in the answers
                connection.answered += chunk
                found = connection.answered.find(marker) if self._trickle is not None else -1
            # what goes on at once: all, or what comes before trickling begins
            at_once = (
                len(chunk) if found < 0 else min(len(chunk), max(0, found + len(marker) - start))
            )
            with contextlib.suppress(OSError):
                client.sendall(chunk[:at_once])
                for byte in chunk[at_once:]:
                    if connection.closed_by_client.wait(self._trickle or 0.0):
                        return
                    client.sendall(bytes([byte]))
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)


def _chunks(sock: socket.socket) -> Iterator[bytes]:
    """What ``sock`` receives, until its peer closes or the socket fails."""
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return
        if not chunk:
            return
        yield chunk
