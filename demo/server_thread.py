"""Run the API in a background thread (for the demo and tests): real HTTP on a real port."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from starlette.types import ASGIApp


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class ServerThread:
    def __init__(self, app: ASGIApp, host: str, port: int, log_level: str = "warning") -> None:
        self.host, self.port = host, port
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread()  # the server's, once started

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        """Listen, then serve in the thread; RuntimeError (one line, nothing logged) when the
        address cannot be listened on or the server does not start."""
        try:
            family = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0][0]
            sock = socket.socket(family, socket.SOCK_STREAM)
        except (OSError, OverflowError) as exc:
            raise RuntimeError(f"cannot listen on {self.url}: {exc}") from exc
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise RuntimeError(f"cannot listen on {self.url}: {exc.strerror or exc}") from exc
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="ledger-api", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"the API server failed to start on {self.url}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the API server did not start within {timeout:.0f} s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def wait(self) -> None:
        while self.thread.is_alive():
            self.thread.join(timeout=0.5)
