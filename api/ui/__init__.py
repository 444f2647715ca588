"""The compliance console, served at ``/ui/`` by the ledger's own process (no build step, no
external asset): :func:`install` adds its pages, its static files and its session keys."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

from api.settings import Settings
from api.ui.routes import SECURITY_HEADERS, router
from api.ui.session import Sessions, session_key
from ledger.signing import SigningKey

STATIC = Path(__file__).parent / "static"
# The pages' headers, but the assets may be kept: revalidated on each use (an upgraded
# verify.js is never run from a stale copy).
STATIC_HEADERS = SECURITY_HEADERS | {"Cache-Control": "no-cache"}


class _Assets(StaticFiles):
    """The console's scripts and style sheet, with the pages' security headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(STATIC_HEADERS)
        return response


def install(app: FastAPI, settings: Settings, log_key: SigningKey) -> None:
    app.state.ui_sessions = Sessions(session_key(log_key), settings.ui_session_seconds)
    app.mount("/ui/static", _Assets(directory=STATIC), name="ui-static")
    app.include_router(router)
