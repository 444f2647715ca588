"""``ledger collect``: the recording proxy beside one vLLM server."""

from __future__ import annotations

import logging
import logging.config
import socket
import sys
from pathlib import Path

import typer
import uvicorn

from cli.common import (
    LogFormatOption,
    check_listen,
    console,
    fail,
    ledger_errors,
    read_public_key,
    read_signing_key,
)
from client.ledger_client import read_token_file
from collectors.collector import Collector, CollectorConfig
from collectors.digest_cache import default_cache_path
from collectors.proxy import create_proxy
from collectors.shipper import DEADLINE, LINGER
from collectors.tiers import TIERS
from ledger.logs import LogFormat, LogLevel, logging_config
from ledger.malloc import fix_mmap_threshold


def _listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        fail(f"--listen {value!r} must be HOST:PORT")
    return host.strip("[]"), int(port)


def collect(
    engine_url: str = typer.Option(
        ..., "--engine-url", help="the vLLM server, e.g. http://127.0.0.1:8000"
    ),
    listen: str = typer.Option("127.0.0.1:8100", "--listen", help="HOST:PORT clients connect to"),
    ledger_url: str = typer.Option(
        ..., "--ledger", "--api", envvar="LEDGER_API_URL", help="ledger API URL"
    ),
    token_file: Path = typer.Option(..., "--token-file", help="bearer token with records:write"),
    key: Path = typer.Option(
        ..., "--key", help="this collector's signing key (PEM, role collector)"
    ),
    pool: str = typer.Option(..., "--pool", help="the pool this worker serves"),
    model_dir: Path = typer.Option(
        ..., "--model-dir", help="the model directory the engine serves"
    ),
    tier: int = typer.Option(
        0,
        "--tier",
        metavar="<0|1|2>",
        help="default tier (the X-Reproducibility-Tier header overrides)",
    ),
    worker_id: str = typer.Option(socket.gethostname(), "--worker-id", help="this worker's ID"),
    spool: Path = typer.Option(
        Path("collector-data/spool.sqlite"), "--spool", help="durable spool file"
    ),
    engine_python: str | None = typer.Option(
        None,
        "--engine-python",
        help="the engine's Python, to read its library versions (default: the server process's)",
    ),
    engine_pid: int | None = typer.Option(
        None,
        "--engine-pid",
        help="the engine server's process ID (default: found by the --engine-url port)",
    ),
    advertise_url: str | None = typer.Option(
        None,
        "--advertise-url",
        help="URL the ledger reaches this collector at, for replays "
        "(default: http://LISTEN, or this host's name when listening on all addresses)",
    ),
    no_register: bool = typer.Option(
        False, "--no-register", help="do not register as a worker (no replays here)"
    ),
    log_key: Path | None = typer.Option(
        None, "--log-key", help="pin the ledger's log public key (default: ask the ledger)"
    ),
    ship_linger: float = typer.Option(
        LINGER,
        "--ship-linger",
        help="seconds to wait for more records before shipping a partial batch (0-10)",
    ),
    ship_deadline: float = typer.Option(
        DEADLINE,
        "--ship-deadline",
        help="seconds a request to the ledger may take in all, however slowly the ledger "
        "answers, before it is abandoned and retried (1-3600)",
    ),
    content_retention_days: int | None = typer.Option(
        None,
        "--content-retention-days",
        envvar="LEDGER_CONTENT_RETENTION_DAYS",
        min=1,
        help="delete spooled records and dead letters older than this many days (the ledger's "
        "retention; unset: keep until shipped)",
    ),
    log_level: LogLevel = typer.Option("warning", help="the lowest level logged"),
    log_format: LogFormat = LogFormatOption,
) -> None:
    """Record every request to the engine, signed, through a durable spool into the ledger."""
    fix_mmap_threshold()  # shipped batches' buffers go back to the system when freed
    log_config = logging_config(log_format, log_level)
    logging.config.dictConfig(log_config)
    if tier not in TIERS:
        fail("--tier must be 0, 1 or 2")
    if not 0 <= ship_linger <= 10:
        fail("--ship-linger must be between 0 and 10 seconds")
    if not 1 <= ship_deadline <= 3600:
        fail("--ship-deadline must be between 1 and 3600 seconds")
    host, port = _listen(listen)
    check_listen(host, port)
    signing_key = read_signing_key(key)
    if advertise_url is None and not no_register:
        shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
        advertise_url = f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"
    with ledger_errors():
        config = CollectorConfig(
            engine_url=engine_url,
            ledger_url=ledger_url,
            ledger_token=read_token_file(token_file),
            key=signing_key,
            pool=pool,
            worker_id=worker_id,
            model_dir=model_dir,
            spool_path=spool,
            default_tier=tier,
            engine_python=engine_python,
            engine_pid=engine_pid,
            digest_cache=default_cache_path(),
            advertise_url=None if no_register else advertise_url,
            log_public_key=read_public_key(log_key) if log_key else None,
            ship_linger=ship_linger,
            ship_deadline=ship_deadline,
            content_retention_days=content_retention_days,
        )
        collector = Collector(config).start()
    state = collector.state
    started = (
        f"collector on http://{host}:{port} -> {engine_url}; pool {pool}, worker {worker_id}\n"
        f"fingerprint {state.fingerprint_id} (batch invariance {state.batch_invariance})\n"
        f"spool {spool} ({collector.spool.pending()} records pending) -> {ledger_url}\n"
        + (f"registers as a worker at {advertise_url}" if not no_register else "not registered")
    )
    if log_format == "json":
        logging.getLogger("ledger.collector").warning("%s", started.replace("\n", "; "))
    else:
        console.print(started)
    # The proxy's event loop shares the GIL with the spool writer and the shipper: hand it back
    # sooner than the default 5 ms, so a request never waits behind a batch being shipped.
    sys.setswitchinterval(0.002)
    try:
        uvicorn.run(
            create_proxy(state), host=host, port=port, log_level=log_level, log_config=log_config
        )
    finally:
        collector.close()
