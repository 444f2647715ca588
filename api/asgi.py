"""App factory for multi-process serving (``ledger serve --workers N``).

Each worker process builds its app from the environment. The parent has already run the
migrations and the bootstrap, so the ledger key exists; workers only load it.
"""

from __future__ import annotations

from fastapi import FastAPI

from api.app import create_app
from api.settings import Settings
from ledger.malloc import fix_mmap_threshold, limit_arenas, trim_every
from ledger.signing import SigningKey
from ledger.storage.database import Database


def app_from_env() -> FastAPI:
    fix_mmap_threshold()  # per process, as `ledger serve` does for one
    limit_arenas()
    trim_every()
    settings = Settings()
    db = Database(settings.resolved_database_url)
    return create_app(settings, db, SigningKey.load(settings.resolved_log_key_file))
