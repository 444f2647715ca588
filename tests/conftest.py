from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from fixture_model import build
from ledger.storage.database import Database
from tests.support.databases import PostgresDatabases, SqliteDatabases, require_postgres
from tests.support.engine import (
    ALLOWED_ORIGIN,
    STRICT_ARGS,
    EngineServer,
    engine_python,
    start_engines,
)
from tests.support.harness import Harness, start_harness
from tests.support.workers import FakeWorker

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]

# No per-example deadline: on a loaded 2-core host one example may take longer than
# hypothesis's 200 ms for reasons of the host alone. Speed is the benchmarks' (bench/).
settings.register_profile("ledger", deadline=None)
settings.load_profile("ledger")


@pytest.fixture(scope="session")
def postgres_databases() -> Iterator[PostgresDatabases]:
    dbs = PostgresDatabases(require_postgres())
    yield dbs
    dbs.drop_all()


@pytest.fixture(scope="session")
def sqlite_databases(tmp_path_factory: pytest.TempPathFactory) -> SqliteDatabases:
    return SqliteDatabases(tmp_path_factory.mktemp("sqlite"))


def fresh_url(request: pytest.FixtureRequest, backend: str) -> str:
    if backend == "postgres":
        pg: PostgresDatabases = request.getfixturevalue("postgres_databases")
        return pg.fresh()
    lite: SqliteDatabases = request.getfixturevalue("sqlite_databases")
    return lite.fresh()


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest) -> Iterator[Database]:
    """A fresh database at the latest schema, on each backend."""
    database = Database(fresh_url(request, request.param))
    yield database
    database.dispose()


def _live_api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    backend = request.param
    harness = start_harness(backend, fresh_url(request, backend), tmp_path_factory.mktemp(backend))
    yield harness
    harness.close()


@pytest.fixture(scope="session", params=BACKENDS)
def api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    """A live API (real HTTP) per backend, shared by the session's API tests."""
    yield from _live_api(request, tmp_path_factory)


@pytest.fixture(params=BACKENDS)
def fresh_api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    """A live API on a fresh ledger per test, per backend: the audit sees only its log."""
    yield from _live_api(request, tmp_path_factory)


@pytest.fixture(scope="session")
def fixture_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The small and tiny fixture models, built once per session (about 2 s)."""
    root = tmp_path_factory.mktemp("models")
    return {size: build(root / size, size=size) for size in ("small", "tiny")}


# Engine pools on the small model: the default scheduler (batch-variant, the negative control),
# the strict serial pool (bitwise reproducible), and the default with only --max-num-seqs
# changed (for fingerprint diffs), and a strict pool computing in float32 (forced replays).
# Started together so their start-ups overlap.
ENGINE_CONFIGS: dict[str, tuple[str, ...]] = {
    "default": (),
    "strict": STRICT_ARGS,
    "seqs8": ("--max-num-seqs", "8"),
    "f32": (*STRICT_ARGS, "--dtype", "float32"),
}


@pytest.fixture(scope="session")
def engines(
    fixture_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, EngineServer]]:
    """Real vLLM CPU servers, one per configuration, shared by the whole session."""
    python = engine_python()
    logs = tmp_path_factory.mktemp("engine-logs")
    servers = {
        name: EngineServer(fixture_models["small"], args, logs / f"{name}.log", python)
        for name, args in ENGINE_CONFIGS.items()
    }
    start_engines(list(servers.values()))
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture(scope="session")
def tiny_engine(
    fixture_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineServer]:
    """One strict vLLM CPU server on the tiny model, shared by the session's differential
    tests (vLLM alone against the same server through a collector: deterministic)."""
    log = tmp_path_factory.mktemp("engine-logs") / "tiny.log"
    # one browser origin allowed (vLLM allows none by default), for the CORS tests
    args = (*STRICT_ARGS, "--allowed-origins", json.dumps([ALLOWED_ORIGIN]))
    server = EngineServer(fixture_models["tiny"], args, log, engine_python()).start()
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture
def fakes() -> Iterator[list[FakeWorker]]:
    """The fake workers a test starts (append them), closed after it."""
    started: list[FakeWorker] = []
    yield started
    for fake in started:
        fake.close()
