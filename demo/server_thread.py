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
        self.thread = threading.Thread(target=self.server.run, name="ledger-api", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
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
