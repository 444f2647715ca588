"""The demo's workers: two real vLLM CPU pools on the fixture model, a collector beside each.

``throughput`` runs vLLM's default scheduler (batch-variant: what most deployments run);
``strict`` runs ``--max-num-seqs 1`` with prefix caching and chunked prefill off (invariant by
construction). Each collector records its engine's traffic and registers as a worker, so the
ledger can replay records and certify the pools. ``demo_traffic`` drives them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import migrations
from api.bootstrap import bootstrap
from client.ledger_client import LedgerClient
from collectors.collector import Collector, CollectorConfig
from collectors.proxy import create_proxy
from demo.errors import DemoTrouble
from demo.server_thread import ServerThread, free_port
from fixture_model import build
from fixture_model.engine import STRICT_ARGS, EngineServer, start_engines
from ledger.signing import SigningKey, public_key_pem
from ledger.storage import tokenstore
from ledger.storage.database import Database

log = logging.getLogger("ledger.demo")

# pool -> (engine flags, engine environment)
Pools = dict[str, tuple[tuple[str, ...], dict[str, str]]]
POOLS: Pools = {"throughput": ((), {}), "strict": (STRICT_ARGS, {})}


@dataclass
class Worker:
    pool: str
    engine: EngineServer
    collector: Collector
    proxy: ServerThread

    @property
    def url(self) -> str:
        return self.proxy.url


class EngineDemo:
    """Owns the engines, collectors and proxies for the demo's lifetime."""

    def __init__(
        self,
        engine_python: str,
        data_dir: Path,
        ledger_url: str,
        token: str,
        pools: Pools | None = None,
        worker_prefix: str = "demo",
    ) -> None:
        self.data_dir = data_dir
        self.ledger_url = ledger_url
        self.token = token
        self.worker_prefix = worker_prefix
        model = data_dir / "fixture-model"
        if not (model / "model.safetensors").exists():
            build(model, size="small")
        self.engines = {
            pool: EngineServer(model, args, data_dir / f"vllm-{pool}.log", engine_python, env)
            for pool, (args, env) in (pools or POOLS).items()
        }
        self.workers: dict[str, Worker] = {}

    @property
    def pools(self) -> list[str]:
        return list(self.engines)

    def start(self, keys: Mapping[str, SigningKey]) -> None:
        """Start the engines, then one collector per pool, each signing with its pool's key."""
        log.info(
            f"starting {len(self.engines)} vLLM pools on the fixture model, "
            f"{' and '.join(self.engines)} (a few minutes on 2 CPU cores) ..."
        )
        started = time.perf_counter()
        try:
            start_engines(list(self.engines.values()))
        except RuntimeError as exc:
            raise DemoTrouble(f"an engine did not start: {exc}") from exc
        log.info(f"vLLM answered in {time.perf_counter() - started:.0f} s")
        for pool, engine in self.engines.items():
            port = free_port()
            collector = Collector(
                CollectorConfig(
                    engine_url=engine.url,
                    ledger_url=self.ledger_url,
                    ledger_token=self.token,
                    key=keys[pool],
                    pool=pool,
                    worker_id=f"{self.worker_prefix}-{pool}",
                    model_dir=engine.model_dir,
                    spool_path=self.data_dir / f"spool-{pool}.sqlite",
                    digest_cache=self.data_dir / "digests.sqlite",
                    advertise_url=f"http://127.0.0.1:{port}",
                    heartbeat_interval=2.0,
                )
            ).start()
            proxy = ServerThread(create_proxy(collector.state), "127.0.0.1", port)
            self.workers[pool] = Worker(pool, engine, collector, proxy.start())
        for worker in self.workers.values():
            if not worker.collector.registered.wait(60):
                raise DemoTrouble(f"the {worker.pool} collector did not register with the ledger")

    def close(self) -> None:
        for worker in self.workers.values():
            worker.proxy.stop()
            worker.collector.close()
        for engine in self.engines.values():
            engine.stop()


def open_embedded_ledger(settings: Any, token_name: str) -> tuple[Database, Any, str]:
    """The ledger's database migrated, its keys bootstrapped, and a token for every scope the
    demo and the GPU check use."""
    db = Database(settings.resolved_database_url)
    migrations.upgrade(db)
    boot = bootstrap(settings, db)
    token, _ = tokenstore.create_token(
        db, token_name, ["records:write", "records:read", "replay", "admin"]
    )
    return db, boot, token


def register_demo_key(client: LedgerClient, data_dir: Path, pool: str) -> SigningKey:
    """The demo's collector key for ``pool`` (kept in the data directory, made on first use),
    registered as production registers one: scoped to its own pool, so it can sign for no
    other."""
    name = f"demo-collector-{pool}"
    key_path = data_dir / f"{name}.pem"
    key = SigningKey.load(key_path) if key_path.exists() else SigningKey.generate()
    if not key_path.exists():
        key.write(key_path, data_dir / f"{name}.pub.pem")
    client.register_key(name, "collector", public_key_pem(key.public_key), pools=[pool])
    return key


def register_demo_keys(
    client: LedgerClient, data_dir: Path, pools: Iterable[str]
) -> dict[str, SigningKey]:
    return {pool: register_demo_key(client, data_dir, pool) for pool in pools}
