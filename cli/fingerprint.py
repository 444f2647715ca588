"""``ledger fingerprint``: snapshot the environment beside an engine and print its fingerprint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from cli.common import (
    ApiOption,
    JsonOption,
    TokenFileOption,
    console,
    err_console,
    fail,
    ledger_errors,
    print_json,
    read_signing_key,
    refuse_existing,
    token_file_or_default,
    write_output,
)
from cli.progress import DelayedByteProgress
from cli.tables import table
from client.ledger_client import LedgerClient, read_token_file
from collectors.artifacts import check_model_dir
from collectors.digest_cache import DigestCache, default_cache_path
from collectors.snapshot import Snapshot, take_snapshot

ENGINE_ROWS = (
    "version",
    "dtype",
    "max_num_seqs",
    "max_model_len",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "tensor_parallel_size",
    "kv_cache_dtype",
    "batch_invariance",
    "system_fingerprint",
)
RUNTIME_ROWS = ("python", "vllm", "torch", "transformers", "tokenizers", "cpu_capability")


def _table(snapshot: Snapshot) -> Table:
    body = snapshot.body
    out = table("field", "value", wrap=["value"], title=f"fingerprint {snapshot.fingerprint_id}")
    model = body["model"]
    art = snapshot.artifacts
    out.add_row("model.digest", model["digest"])
    out.add_row("model.files", f"{art.files} files, {art.total_bytes / 1e6:.1f} MB")
    for field in ("weights_digest", "tokenizer_digest", "generation_config_digest"):
        out.add_row(f"model.{field}", _shown(model[field]))
    template = model["chat_template"]
    out.add_row("model.chat_template", f"{_shown(template['source'])} {_shown(template['digest'])}")
    for field in RUNTIME_ROWS:
        out.add_row(f"runtime.{field}", escape(_shown(body["runtime"].get(field))))
    gpu = body["gpu"]
    names = escape(", ".join(g["name"] or "?" for g in gpu["gpus"]) or "none")
    out.add_row("gpu.gpus", names)
    out.add_row("gpu.driver_version", _shown(gpu["driver_version"]))
    for field in ENGINE_ROWS:
        out.add_row(f"engine.{field}", escape(_shown(body["engine"].get(field))))
    return out


def _shown(value: object) -> str:
    """A field's value for people: "unknown" where the fingerprint could not read it (its
    section's ``unknown`` map says why; ``--json`` shows null)."""
    return "unknown" if value is None else str(value)


def fingerprint(
    model_dir: Path = typer.Option(
        ..., "--model-dir", help="the model directory the engine serves"
    ),
    engine_url: str | None = typer.Option(
        None, "--engine-url", help="the vLLM server, e.g. http://127.0.0.1:8000"
    ),
    engine_pid: int | None = typer.Option(
        None, "--engine-pid", help="the server's PID (default: found by its port)"
    ),
    engine_python: str | None = typer.Option(
        None, "--engine-python", help="the engine's interpreter (default: the server process's)"
    ),
    rehash: bool = typer.Option(
        False, "--rehash", help="ignore the digest cache and hash every file"
    ),
    cache: Path | None = typer.Option(
        None,
        "--digest-cache",
        help="digest cache file (default: LEDGER_DIGEST_CACHE or ~/.cache/inference-ledger)",
    ),
    register: bool = typer.Option(
        False, "--register", help="sign with --key and register with the ledger"
    ),
    key: Path | None = typer.Option(
        None, "--key", help="collector signing key (PEM) for --register"
    ),
    api: str = ApiOption,
    token_file: Path | None = TokenFileOption,
    out: Path | None = typer.Option(None, "--out", help="also write the JSON to this file"),
    force: bool = typer.Option(False, "--force", help="replace a file already at --out"),
    as_json: bool = JsonOption,
) -> None:
    """Snapshot model files, runtime, GPU and engine flags; print the canonical fingerprint."""
    if register and key is None:
        fail("--register needs --key (the collector's signing key)")
    if force and out is None:
        fail("--force only applies with --out")
    if out is not None:
        refuse_existing(out, force)
    signing_key = read_signing_key(key) if register and key is not None else None  # before hashing
    with ledger_errors():
        check_model_dir(model_dir)  # before the digest cache is made
    digest_cache = DigestCache(cache or default_cache_path())
    with ledger_errors(), DelayedByteProgress("hashing model files") as progress:
        snapshot = take_snapshot(
            model_dir,
            engine_url=engine_url,
            engine_pid=engine_pid,
            engine_python=engine_python,
            cache=digest_cache,
            rehash=rehash,
            progress=progress,
        )
    digest_cache.close()
    if digest_cache.error:
        err_console.print(f"[yellow]warning:[/] {escape(digest_cache.error)}")
    document: dict[str, Any] = {
        "fingerprint_id": snapshot.fingerprint_id,
        "body": snapshot.body,
        "identity": snapshot.identity,
    }
    if register:
        assert signing_key is not None
        with ledger_errors():
            token = read_token_file(token_file_or_default(token_file))
            with LedgerClient(api, token) as client:
                document["registration"] = client.register_fingerprint(
                    snapshot.envelope(signing_key)
                )
    if out is not None:
        write_output(out, _dumps(document).encode(), force)
    if as_json:
        print_json(document)
        return
    console.print(_table(snapshot))
    stats = snapshot.artifacts
    console.print(
        f"hashed {stats.hashed_bytes / 1e6:.1f} MB; {stats.cached_files} of {stats.files} "
        "file digests from the cache"
    )
    for field, reason in snapshot.unknown().items():
        console.print(f"[yellow]unknown[/] {escape(field)}: {escape(reason)}")
    if "registration" in document:
        reg = document["registration"]
        console.print(f"registered: {reg['status']} at log index {reg['log_index']}")


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"
