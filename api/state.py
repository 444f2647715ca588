"""What the app holds: the database, the ledger key, the settings, the metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from api.metrics import Metrics
from api.settings import Settings
from ledger.signing import SigningKey
from ledger.storage.database import Database


@dataclass
class AppState:
    settings: Settings
    db: Database
    log_key: SigningKey
    metrics: Metrics
    origin: str


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.ledger
    return state


StateDep = Annotated[AppState, Depends(get_state)]
