"""A live ledger API on a real port, with helpers to act as admin and as a collector."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import migrations
from api.app import create_app
from api.bootstrap import bootstrap
from api.settings import Settings
from demo.server_thread import ServerThread, free_port
from ledger.signing import Envelope, SigningKey, public_key_pem
from ledger.storage import tokenstore
from ledger.storage.database import Database
from tests.support.documents import fingerprint_envelope, record_envelope

# Small limits so the limit tests stay cheap.
MAX_BODY = 2 * 1024 * 1024
MAX_BATCH = 50


@dataclass
class Harness:
    backend: str
    url: str
    db: Database
    settings: Settings
    log_key: SigningKey
    admin_token: str
    server: ServerThread
    _clients: list[httpx.Client] = field(default_factory=list)

    def client(self, token: str | None = "admin") -> httpx.Client:
        secret = self.admin_token if token == "admin" else token
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        c = httpx.Client(base_url=self.url, headers=headers, timeout=30)
        self._clients.append(c)
        return c

    def token(self, *scopes: str) -> str:
        secret, _ = tokenstore.create_token(self.db, "test", list(scopes))
        return secret

    def collector(self, role: str = "collector", pools: list[str] | None = None) -> SigningKey:
        key = SigningKey.generate()
        scope = {} if pools is None else {"pools": pools}
        resp = self.client().post(
            "/v1/keys",
            json={
                "name": f"k-{key.key_id[8:16]}",
                "role": role,
                "public_key": public_key_pem(key.public_key),
                **scope,
            },
        )
        assert resp.status_code == 201, resp.text
        return key

    def fingerprint(self, key: SigningKey) -> str:
        resp = self.client().post("/v1/fingerprints", content=fingerprint_envelope(key).canonical)
        assert resp.status_code == 201, resp.text
        fp_id: str = resp.json()["fingerprint_id"]
        return fp_id

    def setup_collector(self) -> tuple[SigningKey, str]:
        key = self.collector()
        return key, self.fingerprint(key)

    def post(
        self, items: list[Envelope | dict[str, Any]], token: str | None = "admin"
    ) -> httpx.Response:
        envs = [i.to_dict() if isinstance(i, Envelope) else i for i in items]
        return self.client(token).post("/v1/records", json={"envelopes": envs})

    def record(self, key: SigningKey, fp_id: str, **kw: Any) -> Envelope:
        return record_envelope(key, fp_id, **kw)

    def close(self) -> None:
        for c in self._clients:
            c.close()
        self.server.stop()
        self.db.dispose()


def start_harness(backend: str, url: str, data_dir: Path) -> Harness:
    settings = Settings(
        data_dir=data_dir,
        database_url=url,
        max_body_bytes=MAX_BODY,
        max_batch_records=MAX_BATCH,
        token_cache_seconds=0,  # revocation tests expect the next request to be refused
    )
    db = Database(url)
    migrations.upgrade(db)
    boot = bootstrap(settings, db)
    assert boot.admin_token_file is not None
    admin = boot.admin_token_file.read_text().strip()
    server = ServerThread(create_app(settings, db, boot.log_key), "127.0.0.1", free_port()).start()
    return Harness(backend, server.url, db, settings, boot.log_key, admin, server)
