"""The FastAPI application factory."""

from __future__ import annotations

from fastapi import FastAPI

from api import errors
from api.metrics import Metrics
from api.routes import fingerprints, health, keys, records
from api.settings import Settings
from api.state import AppState
from ledger import __version__
from ledger.signing import SigningKey
from ledger.storage.database import Database


def create_app(settings: Settings, db: Database, log_key: SigningKey) -> FastAPI:
    """Build the app around an already migrated database and the ledger's key."""
    app = FastAPI(
        title="inference-ledger",
        version=__version__,
        description=(
            "Fingerprint and audit-trail ledger for self-hosted LLM inference. "
            'Errors are JSON: {"error": {"code", "message", "details"?}}.'
        ),
    )
    metrics = Metrics()
    app.state.ledger = AppState(settings=settings, db=db, log_key=log_key, metrics=metrics)
    app.middleware("http")(metrics.middleware)
    errors.install(app)
    for module in (health, keys, fingerprints, records):
        app.include_router(module.router)
    return app
