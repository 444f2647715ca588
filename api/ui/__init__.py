"""The compliance console, served at ``/ui/`` by the ledger's own process (no build step, no
external asset): :func:`install` adds its pages, its static files and its session keys."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from api.settings import Settings
from api.ui.routes import router
from api.ui.session import Sessions, session_key
from ledger.signing import SigningKey

STATIC = Path(__file__).parent / "static"


def install(app: FastAPI, settings: Settings, log_key: SigningKey) -> None:
    app.state.ui_sessions = Sessions(session_key(log_key), settings.ui_session_seconds)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
    app.include_router(router)
