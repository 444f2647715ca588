"""The whole environment snapshot: model, runtime, GPU and engine, as one fingerprint.

The body holds only what determines outputs, so identical workers share a fingerprint ID;
per-machine identity (hostname, GPU UUIDs, engine URL and PID, local paths) is returned beside
it for the worker registration. Every section is present; what could not be read is listed in
the section's ``unknown`` map with the reason, never left out silently or invented.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.artifacts import ArtifactSnapshot, Progress, snapshot_artifacts
from collectors.digest_cache import DigestCache
from collectors.engine import engine_port, server_info, snapshot_engine
from collectors.gpu import snapshot_gpus
from collectors.gpu_visibility import Visibility
from collectors.overrides import chat_template
from collectors.procinfo import EngineProcess, ProcessUnreadable, find_pid_by_port, read_process
from collectors.runtime import engines_own, snapshot_runtime
from ledger.fingerprint import (
    FINGERPRINT_KIND,
    FINGERPRINT_SCHEMA_VERSION,
    validate_fingerprint_body,
)
from ledger.signing import Envelope, SigningKey, sign_envelope
from ledger.worker_url import parse_worker_url

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"})


@dataclass(frozen=True)
class Snapshot:
    body: dict[str, Any]
    identity: dict[str, Any]
    artifacts: ArtifactSnapshot
    fingerprint_id: str

    def envelope(self, key: SigningKey) -> Envelope:
        return sign_envelope(FINGERPRINT_KIND, self.body, key)

    def unknown(self) -> dict[str, str]:
        """Every unknown field of every section, as ``section.field: reason``."""
        found: dict[str, str] = {}
        for section, value in self.body.items():
            if isinstance(value, dict):
                for field, reason in (value.get("unknown") or {}).items():
                    found[f"{section}.{field}"] = reason
        return found


def is_local(host: str) -> bool:
    if host in LOCAL_HOSTS or host.startswith("127."):
        return True
    try:
        name = socket.gethostname()
        return host == name or host in socket.gethostbyname_ex(name)[2]
    except OSError:
        return False


@dataclass(frozen=True)
class EngineLookup:
    """The engine's process, or why it could not be read: ``reason`` for the fingerprint body
    (the same on every run and host), ``detail`` for the identity (names the PID, port, host)."""

    process: EngineProcess | None
    reason: str | None = None
    detail: str | None = None


def locate_engine(engine_url: str | None, engine_pid: int | None) -> EngineLookup:
    """The engine's process, or None and why it could not be read."""
    try:
        if engine_pid is not None:
            return EngineLookup(read_process(engine_pid))
        if engine_url is None:
            reason = "no --engine-url or --engine-pid given"
            return EngineLookup(None, reason, reason)
        host, port = engine_port(engine_url)
        if not is_local(host):
            return EngineLookup(
                None,
                "the engine is not on this host; pass --engine-pid",
                f"the engine ({host}) is not on this host; pass --engine-pid",
            )
        return EngineLookup(read_process(find_pid_by_port(port)))
    except ProcessUnreadable as exc:
        return EngineLookup(None, exc.reason, str(exc))
    except ValueError as exc:
        return EngineLookup(None, "the engine URL names no host or port to look for", str(exc))


def take_snapshot(
    model_dir: Path,
    *,
    engine_url: str | None = None,
    engine_pid: int | None = None,
    engine_python: str | None = None,
    cache: DigestCache | None = None,
    rehash: bool = False,
    progress: Progress | None = None,
    nvml: Any = None,
) -> Snapshot:
    """Snapshot everything.

    Raises InvalidInput for a bad model directory and Unreachable for an engine that does not
    answer; anything else that cannot be read is reported in the sections' ``unknown`` maps.
    """
    if engine_url is not None:  # before hashing the model: a malformed URL is said at once
        parse_worker_url(engine_url, "engine url")
    artifacts = snapshot_artifacts(
        model_dir, cache=cache or DigestCache(None), rehash=rehash, progress=progress
    )
    info = server_info(engine_url) if engine_url is not None else None
    lookup = locate_engine(engine_url, engine_pid)
    process = lookup.process
    interpreter = engine_python or (process.interpreter() if process is not None else None)
    runtime = snapshot_runtime(interpreter)
    gpu = snapshot_gpus(
        nvml,
        Visibility.of_engine(process.env if process is not None else None),
        unseen=f"the engine's environment is unknown ({lookup.reason})",
    )
    engine = snapshot_engine(engine_url, process, lookup.reason, info=info)
    runtime = engines_own(runtime, engine.body.get("version"))
    model = artifacts.body
    template_identity: dict[str, Any] = {}
    if process is not None:
        template, template_identity, reason = chat_template(process, engine.argv)
        if template is not None:  # what the engine applies, not the directory's own
            model = {**model, "chat_template": template}
        if reason is not None:
            model["unknown"] = {**model["unknown"], "chat_template": reason}
    body: dict[str, Any] = {
        "schema_version": FINGERPRINT_SCHEMA_VERSION,
        "model": model,
        "runtime": runtime.body,
        "gpu": gpu.body,
        "engine": engine.body,
    }
    identity: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "model_dir": str(model_dir.resolve()),
        "engine_python": runtime.interpreter,
        "engine": engine.identity,
        **template_identity,
        "gpu": gpu.identity,
    }
    if lookup.detail is not None:
        identity["engine_process_problem"] = lookup.detail
    return Snapshot(body, identity, artifacts, validate_fingerprint_body(body))
