"""``ledger demo``: the main job on embedded defaults.

Starts the API on SQLite. With ``--engine-python`` (what ``make demo`` passes) it then starts
two real vLLM CPU pools on the fixture model (throughput: the default scheduler; strict:
serial), a recording collector beside each (``demo_engine``), and sends them concurrent mixed
traffic, replays request IDs, looks one up by cache key and certifies both pools
(``demo_traffic``); without, it signs and ingests a synthetic sample record. Either way it
exports and verifies an evidence bundle offline, audits the ledger, prints a summary, then keeps
serving (``--once`` exits).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import typer

from api.app import create_app
from cli.common import (
    check_listen,
    console,
    err_console,
    fail,
    ledger_errors,
    load_settings,
    print_json,
    show_progress,
)
from cli.tables import table
from client.ledger_client import LedgerClient
from demo import traffic as demo_traffic
from demo.engine import EngineDemo, open_embedded_ledger, register_demo_keys
from demo.scenario import evidence_and_audit, walkthrough
from demo.server_thread import ServerThread, free_port


def demo(
    once: bool = typer.Option(False, "--once", help="exit after the demo instead of serving"),
    port: int = typer.Option(8700, min=0, max=65535, help="API port (0 picks a free one)"),
    data_dir: Path | None = typer.Option(None, help="data directory (LEDGER_DATA_DIR)"),
    engine_python: Path | None = typer.Option(
        None,
        "--engine-python",
        help="the vLLM environment's Python: send real engine traffic through a collector",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="print the steps as JSON on stdout (messages go to stderr)"
    ),
) -> None:
    """Run the ledger on embedded defaults and record inference traffic in it."""
    # SIGTERM (docker stop, systemd, kill) stops the demo like Ctrl-C does: the engines run
    # in their own sessions and would otherwise outlive it.
    signal.signal(signal.SIGTERM, _interrupt)
    show_progress()
    if engine_python is not None and not engine_python.exists():
        fail(f"{engine_python} does not exist (run `make engine`)")
    settings = load_settings(data_dir=data_dir)
    if port:
        check_listen(settings.host, port)  # before the ledger, its keys and token are made
    with ledger_errors():
        db, boot, token = open_embedded_ledger(settings, "demo")
    app = create_app(settings, db, boot.log_key)
    server = ServerThread(app, settings.host, port or free_port(settings.host))
    try:
        server.start()
    except RuntimeError as exc:
        fail(f"{exc} (is port {server.port} in use? try --port 0)")
    say = err_console.print if as_json else console.print
    say(f"[bold]ledger API[/] on {server.url} (database {db.describe()})")
    t0 = time.perf_counter()
    engine: EngineDemo | None = None
    try:
        with ledger_errors(), LedgerClient(server.url, token) as client:
            if engine_python is None:
                rows, request_id = walkthrough(client, settings.data_dir)
            else:
                engine = EngineDemo(str(engine_python), settings.data_dir, server.url, token)
                keys = register_demo_keys(client, settings.data_dir, engine.pools)
                engine.start(keys)
                rows, ids, request_id = demo_traffic.traffic(engine.workers, client, keys)
                rows += demo_traffic.replays(client, ids)
                rows += demo_traffic.cache_lookup(client, request_id)
                rows += [demo_traffic.certify(client, pool) for pool in ("strict", "throughput")]
            rows += evidence_and_audit(client, db, settings.data_dir, request_id)
    except BaseException:
        if engine is not None:
            engine.close()
        server.stop()
        raise
    try:  # from here on, Ctrl-C or SIGTERM at any point stops everything and exits 0
        seconds = time.perf_counter() - t0
        if as_json:
            collectors = {
                w.pool: f"{w.url}/v1" for w in (engine.workers if engine else {}).values()
            }
            print_json(
                {
                    "url": server.url,
                    "database": db.describe(),
                    "seconds": round(seconds, 3),
                    "steps": [{"step": step, "result": result} for step, result in rows],
                    "collectors": collectors,
                }
            )
        else:
            out = table("step", "result", wrap=["result"], title=f"demo ({seconds:.2f} s)")
            for step, result in rows:
                out.add_row(step, result)
            console.print(out)
        if once:
            return
        say(
            f"serving on {server.url} (OpenAPI at {server.url}/docs); admin token in "
            f"{settings.resolved_admin_token_file} if this was the first start. Ctrl-C to stop."
        )
        if engine is not None:
            for worker in engine.workers.values():
                say(
                    f"pool {worker.pool}: OpenAI-compatible collector on {worker.url}/v1 "
                    "(records everything)"
                )
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if engine is not None:
            engine.close()
        server.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
