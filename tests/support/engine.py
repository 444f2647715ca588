"""The vLLM engine for tests: skip without it, except under CI=true, where it must run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fixture_model.engine import (
    DEFAULT_ENGINE_PYTHON,
    STRICT_ARGS,
    EngineServer,
    free_port,
    start_engines,
)

ENGINE_PYTHON_ENV = "LEDGER_ENGINE_PYTHON"
# The browser origin the shared tiny engine allows (vLLM allows none by default).
ALLOWED_ORIGIN = "https://console.example"
__all__ = [
    "ALLOWED_ORIGIN",
    "STRICT_ARGS",
    "EngineServer",
    "engine_python",
    "free_port",
    "start_engines",
]


def engine_python() -> str:
    """The engine interpreter; skip (or fail under CI) when it is not installed."""
    python = os.environ.get(ENGINE_PYTHON_ENV) or str(DEFAULT_ENGINE_PYTHON)
    if not Path(python).exists():
        message = f"vLLM engine environment not found at {python} (run `make engine`)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (CI=true: engine tests must run)")
        pytest.skip(message)
    return python
