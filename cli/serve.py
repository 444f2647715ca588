"""``ledger serve``: migrate, bootstrap and run the API."""

from __future__ import annotations

import logging
import logging.config
import os
import shutil
import tempfile
from typing import Any

import typer
import uvicorn

import migrations
from api.app import create_app
from api.bootstrap import bootstrap
from api.metrics import MULTIPROC_ENV
from api.server_protocol import HeaderTimeoutProtocol
from cli.common import LogFormatOption, check_listen, console, ledger_errors, load_settings
from ledger.logs import LogFormat, LogLevel, logging_config
from ledger.malloc import fix_mmap_threshold, limit_arenas, trim_every
from ledger.storage.database import Database

logger = logging.getLogger("ledger.serve")

# uvicorn's own limits, set explicitly. Request bodies are bounded by the app's gate
# (LEDGER_MAX_BODY_BYTES, LEDGER_BODY_TIMEOUT: api/gate.py); these bound the connection.
SERVER_LIMITS: dict[str, Any] = {
    # httptools, with a deadline for each request's headers (10 s; api/server_protocol.py):
    # uvicorn alone holds a silent or slowly-writing connection forever
    "http": HeaderTimeoutProtocol,
    # an idle keep-alive connection is closed after 5 s
    "timeout_keep_alive": 5,
    # connections and requests in progress at once per process; beyond it new requests get
    # 503 from uvicorn, so a flood of (slow) connections cannot take every file descriptor
    "limit_concurrency": 1024,
    # a stop waits this long for requests in flight, then closes their connections
    "timeout_graceful_shutdown": 30,
}


def serve(
    host: str | None = typer.Option(None, help="bind address (LEDGER_HOST, default 127.0.0.1)"),
    port: int | None = typer.Option(None, help="port (LEDGER_PORT, default 8700)"),
    db_url: str | None = typer.Option(None, "--db", help="database URL (LEDGER_DATABASE_URL)"),
    workers: int = typer.Option(1, min=1, help="worker processes (appends stay serialized)"),
    log_level: LogLevel = typer.Option("info", help="the lowest level logged"),
    log_format: LogFormat = LogFormatOption,
) -> None:
    """Run the ledger API (SQLite in LEDGER_DATA_DIR unless LEDGER_DATABASE_URL is set)."""
    settings = load_settings(host=host, port=port, database_url=db_url)
    check_listen(settings.host, settings.port)
    fix_mmap_threshold()  # ingest batches' buffers go back to the system when freed
    limit_arenas()  # before threads start: two heaps to fragment, not one per thread
    log_config = logging_config(log_format, log_level)
    logging.config.dictConfig(log_config)
    with ledger_errors():
        db = Database(settings.resolved_database_url)
        migrations.upgrade(db)
        boot = bootstrap(settings, db)
    say = logger.info if log_format == "json" else console.print
    say(f"ledger: database {db.describe()}")
    say(f"ledger: log key {boot.log_key.key_id}")
    if boot.admin_token_file is not None:
        say(f"ledger: first start: admin token written to {boot.admin_token_file}")
    if workers == 1:
        trim_every()  # free heap pages back to the system each minute
        app = create_app(settings, db, boot.log_key)
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_level=log_level,
            log_config=log_config,
            **SERVER_LIMITS,
        )
        return
    db.dispose()
    # Worker processes rebuild the app from the environment (api.asgi), and write their
    # metrics to one fresh directory, which any of them sums when scraped (api.metrics).
    metrics_dir = tempfile.mkdtemp(prefix="ledger-metrics-")
    os.environ[MULTIPROC_ENV] = metrics_dir
    os.environ["LEDGER_DATABASE_URL"] = settings.resolved_database_url
    os.environ["LEDGER_LOG_KEY_FILE"] = str(settings.resolved_log_key_file.resolve())
    os.environ["LEDGER_DATA_DIR"] = str(settings.data_dir.resolve())
    try:
        uvicorn.run(
            "api.asgi:app_from_env",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=workers,
            log_level=log_level,
            log_config=log_config,
            **SERVER_LIMITS,
        )
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
