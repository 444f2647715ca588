from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledger.storage.database import Database
from tests.support.databases import PostgresDatabases, SqliteDatabases, require_postgres
from tests.support.harness import Harness, start_harness

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


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


@pytest.fixture(scope="session", params=BACKENDS)
def api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    """A live API (real HTTP) per backend, shared by the session's API tests."""
    backend = request.param
    harness = start_harness(backend, fresh_url(request, backend), tmp_path_factory.mktemp(backend))
    yield harness
    harness.close()
