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

import base64
import json
import random
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer

from api.app import create_app
from cli import demo_traffic
from cli.common import (
    console,
    fail,
    ledger_errors,
    load_settings,
    table,
    write_atomically,
)
from cli.demo_engine import EngineDemo, open_embedded_ledger, register_demo_key
from cli.server_thread import ServerThread, free_port
from collectors.ledger_client import LedgerClient
from ledger.evidence import verify_bundle
from ledger.fingerprint import FINGERPRINT_KIND, fingerprint_id
from ledger.packing import unpack_float32
from ledger.records import RECORD_KIND, Choice, build_record_body
from ledger.signing import Envelope, SigningKey, public_key_pem, sign_envelope, verify_envelope
from ledger.storage.audit import audit
from ledger.storage.database import Database


def sample_fingerprint() -> dict[str, Any]:
    """A fingerprint body for the demo's sample record (real collectors snapshot the engine)."""
    return {
        "schema_version": 1,
        "model": {"name": "demo-sample", "source": "ledger demo (no engine attached)"},
        "engine": {"name": "none"},
    }


def sample_record(fp_id: str, rng: random.Random) -> dict[str, Any]:
    prompt = [rng.randrange(3, 512) for _ in range(24)]
    out = [rng.randrange(3, 512) for _ in range(16)]
    # logprobs with all 24 mantissa bits in use: the round trip must keep every one
    lps = [-rng.random() * 4 for _ in out]
    top_ids = [[t, *rng.sample(range(3, 512), 4)] for t in out]
    top_lps = [[lp, *sorted((lp - rng.random() * 3 for _ in range(4)), reverse=True)] for lp in lps]
    return build_record_body(
        request_id=f"demo-{datetime.now(UTC):%Y%m%dT%H%M%S}-{rng.randrange(16**6):06x}",
        fingerprint_id=fp_id,
        worker_id="demo-worker",
        pool="demo",
        tier=1,
        endpoint="/v1/completions",
        model="demo-sample",
        request={"model": "demo-sample", "prompt": prompt, "max_tokens": 16, "temperature": 0},
        prompt_token_ids=prompt,
        choices=[Choice(out, lps, top_ids, top_lps, finish_reason="length")],
        started_at=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        ttft_ns=1_250_000,
        total_ns=18_500_000,
        system_fingerprint=None,
    )


def demo(
    once: bool = typer.Option(False, "--once", help="exit after the demo instead of serving"),
    port: int = typer.Option(8700, help="API port (0 picks a free one)"),
    data_dir: Path | None = typer.Option(None, help="data directory (LEDGER_DATA_DIR)"),
    engine_python: Path | None = typer.Option(
        None,
        "--engine-python",
        help="the vLLM environment's Python: send real engine traffic through a collector",
    ),
) -> None:
    """Run the ledger on embedded defaults and record inference traffic in it."""
    # SIGTERM (docker stop, systemd, kill) stops the demo like Ctrl-C does: the engines run
    # in their own sessions and would otherwise outlive it.
    signal.signal(signal.SIGTERM, _interrupt)
    settings = load_settings(data_dir=data_dir)
    with ledger_errors():
        db, boot, token = open_embedded_ledger(settings, "demo")
    app = create_app(settings, db, boot.log_key)
    server = ServerThread(app, settings.host, port or free_port(settings.host))
    try:
        server.start()
    except RuntimeError as exc:
        fail(f"{exc} (is port {server.port} in use? try --port 0)")
    console.print(f"[bold]ledger API[/] on {server.url} (database {db.describe()})")
    t0 = time.perf_counter()
    engine: EngineDemo | None = None
    if engine_python is not None and not engine_python.exists():
        server.stop()
        fail(f"{engine_python} does not exist (run `make engine`)")
    try:
        with ledger_errors(), LedgerClient(server.url, token) as client:
            if engine_python is None:
                rows, request_id = _walkthrough(client, settings.data_dir)
            else:
                key = register_demo_key(client, settings.data_dir)
                engine = EngineDemo(str(engine_python), settings.data_dir, server.url, token)
                engine.start(key)
                rows, ids, request_id = demo_traffic.traffic(engine.workers, client, key)
                rows += demo_traffic.replays(client, ids)
                rows += demo_traffic.cache_lookup(client, request_id)
                rows += [demo_traffic.certify(client, pool) for pool in ("strict", "throughput")]
            rows += _evidence_and_audit(client, db, settings.data_dir, request_id)
    except BaseException:
        if engine is not None:
            engine.close()
        server.stop()
        raise
    try:  # from here on, Ctrl-C or SIGTERM at any point stops everything and exits 0
        out = table("step", "result", title=f"demo ({time.perf_counter() - t0:.2f} s)")
        for step, result in rows:
            out.add_row(step, result)
        console.print(out)
        if once:
            return
        console.print(
            f"serving on {server.url} (OpenAPI at {server.url}/docs); admin token in "
            f"{settings.resolved_admin_token_file} if this was the first start. Ctrl-C to stop."
        )
        if engine is not None:
            for worker in engine.workers.values():
                console.print(
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


def _walkthrough(client: LedgerClient, data_dir: Path) -> tuple[list[tuple[str, str]], str]:
    """Register a key and a fingerprint, ingest a signed record, read it back; return the
    summary rows and the record's request ID."""
    rows: list[tuple[str, str]] = []
    key_path = data_dir / "demo-collector.pem"
    key = SigningKey.load(key_path) if key_path.exists() else SigningKey.generate()
    if not key_path.exists():
        key.write(key_path, data_dir / "demo-collector.pub.pem")
    info = client.register_key("demo-collector", "collector", public_key_pem(key.public_key))
    rows.append(("collector key registered", info["key_id"]))

    fp_body = sample_fingerprint()
    fp = client.register_fingerprint(sign_envelope(FINGERPRINT_KIND, fp_body, key))
    if fp["fingerprint_id"] != fingerprint_id(fp_body):
        fail("the ledger computed a different fingerprint ID", 1)
    rows.append(("fingerprint registered", f"{fp['fingerprint_id'][:23]}… ({fp['status']})"))

    body = sample_record(fp["fingerprint_id"], random.Random())
    sent = sign_envelope(RECORD_KIND, body, key)
    result = client.post_records([sent])["results"][0]
    rows.append(("record ingested", f"{result['request_id']} at log index {result['log_index']}"))

    got = client.get_record(body["request_id"])
    back = Envelope.from_dict(got["envelope"])
    verify_envelope(back, key.public_key)
    rows.append(("signature verified", f"{back.key_id[:23]}… over {len(back.body_bytes)} bytes"))
    sent_lp = base64.b64decode(body["choices"][0]["logprobs"])
    back_lp = base64.b64decode(back.body["choices"][0]["logprobs"])
    if sent_lp != back_lp or back.canonical != sent.canonical:
        fail("the record read back differs from the one sent", 1)
    rows.append(("logprobs bit-exact", f"{len(sent_lp) // 4} float32 values, identical bytes"))
    rows.append(("first logprob", repr(unpack_float32(back.body["choices"][0]["logprobs"])[0])))
    page = client.search_records(model="demo-sample", fields="meta", limit=1000)
    rows.append(("records for demo-sample", str(page["count"])))
    return rows, body["request_id"]


def _evidence_and_audit(
    client: LedgerClient, db: Database, data_dir: Path, request_id: str
) -> list[tuple[str, str]]:
    """What a compliance officer does: export evidence, verify it offline, audit the ledger."""
    rows: list[tuple[str, str]] = []
    cp = client.sign_checkpoint()
    rows.append(("checkpoint signed", f"tree size {cp['tree_size']}, origin {cp['origin']}"))
    bundle = client.evidence(request_id)
    path = data_dir / f"evidence-{request_id}.json"
    write_atomically(path, (json.dumps(bundle, indent=2) + "\n").encode())
    pinned = SigningKey.load(data_dir / "log-key.pem").public_key
    result = verify_bundle(json.loads(path.read_text()), pinned)
    rows.append(
        (
            "evidence verified offline",
            f"{path} (leaf {result.leaf_index} of {result.tree_size}, log key pinned"
            + (
                f"; replay verdicts: {', '.join(result.replay_verdicts)})"
                if result.replay_verdicts
                else ")"
            ),
        )
    )
    report = audit(db, pinned)
    if not report.ok:
        fail(f"audit failed: {report.findings[0].message}", 1)
    rows.append(
        (
            "ledger audited",
            f"{report.leaves} leaves, {report.checkpoints} checkpoints: all checks pass",
        )
    )
    return rows
