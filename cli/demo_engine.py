"""The demo's traffic through a real engine: vLLM CPU on the fixture model, behind a collector.

Builds the fixture model (once), starts a strict (serial, batch-invariant) vLLM CPU server, puts
a recording collector in front of it, sends a tier-2 completion and a streamed chat through the
collector as any OpenAI client would, and checks what reached the ledger: the signed records,
their token IDs and their float32 logprob bits, against what the client was answered.
"""

from __future__ import annotations

import base64
import struct
import time
from pathlib import Path
from typing import Any

import httpx

from cli.common import console, fail
from cli.server_thread import ServerThread, free_port
from collectors.collector import Collector, CollectorConfig
from collectors.ledger_client import LedgerClient
from collectors.proxy import create_proxy
from fixture_model import build
from fixture_model.engine import STRICT_ARGS, EngineServer
from ledger.errors import NotFound
from ledger.signing import Envelope, SigningKey, public_key_pem, verify_envelope


class EngineDemo:
    """Owns the engine, the collector and its proxy for the demo's lifetime."""

    def __init__(self, engine_python: str, data_dir: Path, ledger_url: str, token: str) -> None:
        self.data_dir = data_dir
        self.ledger_url = ledger_url
        self.token = token
        model = data_dir / "fixture-model"
        if not (model / "model.safetensors").exists():
            build(model, size="small")
        self.engine = EngineServer(model, STRICT_ARGS, data_dir / "vllm.log", engine_python)
        self.collector: Collector | None = None
        self.proxy: ServerThread | None = None

    def start(self, key: SigningKey) -> None:
        console.print("starting vLLM CPU on the fixture model (about a minute on 2 cores) ...")
        started = time.perf_counter()
        self.engine.start()
        try:
            self.engine.wait_ready()
        except RuntimeError as exc:
            fail(f"the engine did not start: {exc}")
        console.print(
            f"vLLM answered on {self.engine.url} in {time.perf_counter() - started:.0f} s"
        )
        self.collector = Collector(
            CollectorConfig(
                engine_url=self.engine.url,
                ledger_url=self.ledger_url,
                ledger_token=self.token,
                key=key,
                pool="demo-strict",
                worker_id="demo-worker",
                model_dir=self.engine.model_dir,
                spool_path=self.data_dir / "collector-spool.sqlite",
                digest_cache=self.data_dir / "digests.sqlite",
            )
        ).start()
        client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
        app = create_proxy(self.collector.state, client)
        self.proxy = ServerThread(app, "127.0.0.1", free_port()).start()

    def traffic(self, key: SigningKey, client: LedgerClient) -> tuple[list[tuple[str, str]], str]:
        """Send requests through the collector; check the records; return rows and one ID."""
        assert self.proxy is not None and self.collector is not None
        rows = [
            ("engine", f"vLLM CPU, strict pool, {self.engine.url}"),
            (
                "fingerprint",
                f"{self.collector.state.fingerprint_id[:23]}… "
                f"(batch invariance {self.collector.state.batch_invariance})",
            ),
            ("collector", f"{self.proxy.url} -> {self.engine.url}"),
        ]
        with httpx.Client(base_url=self.proxy.url, timeout=120) as http:
            answer = http.post(
                "/v1/completions",
                json={
                    "model": "fixture",
                    "prompt": "The ledger keeps a record of",
                    "max_tokens": 12,
                    "temperature": 0,
                    "logprobs": 1,
                },
                headers={"X-Reproducibility-Tier": "2"},
            )
            if answer.status_code != 200:
                fail(f"the collector answered {answer.status_code}: {answer.text[:300]}")
            request_id = answer.headers["x-request-id"]
            choice = answer.json()["choices"][0]
            streamed = http.post(
                "/v1/chat/completions",
                json={
                    "model": "fixture",
                    "messages": [{"role": "user", "content": "What is a replay?"}],
                    "max_tokens": 8,
                    "temperature": 0,
                    "stream": True,
                },
            )
            chat_id = streamed.headers["x-request-id"]
        rows.append(("completion (tier 2)", f"{request_id}: {choice['text']!r}"))
        rows.append(("streamed chat", chat_id))
        record = self._wait(client, request_id)
        verify_envelope(Envelope.from_dict(record["envelope"]), key.public_key)
        body = record["envelope"]["body"]
        raw = base64.b64decode(body["choices"][0]["logprobs"])
        recorded = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        answered = choice["logprobs"]["token_logprobs"]
        if struct.pack(f"<{len(answered)}f", *answered) != raw:
            fail("the recorded logprobs differ from the ones the client was answered")
        rows.append(
            (
                "record in the ledger",
                f"signed, log index {record['log_index']}, {len(recorded)} tokens, "
                "logprob bits equal to the answer",
            )
        )
        chat = self._wait(client, chat_id)["envelope"]["body"]
        rows.append(("streamed chat recorded", f"text {chat['choices'][0]['text']!r}"))
        return rows, request_id

    @staticmethod
    def _wait(client: LedgerClient, request_id: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return client.get_record(request_id)
            except NotFound:
                if time.monotonic() > deadline:
                    fail(f"record {request_id} did not reach the ledger within {timeout:.0f} s")
                time.sleep(0.1)

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self.collector is not None:
            self.collector.close()
        self.engine.stop()


def register_demo_key(client: LedgerClient, data_dir: Path) -> SigningKey:
    key_path = data_dir / "demo-collector.pem"
    key = SigningKey.load(key_path) if key_path.exists() else SigningKey.generate()
    if not key_path.exists():
        key.write(key_path, data_dir / "demo-collector.pub.pem")
    client.register_key("demo-collector", "collector", public_key_pem(key.public_key))
    return key
