"""``ledger verify``: check an evidence bundle fully offline."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from cli.common import (
    JsonOption,
    console,
    err_console,
    fail,
    print_json,
    read_public_key,
    shown,
    when,
    when_json,
)
from ledger.errors import LedgerError, VerificationError
from ledger.evidence import FINGERPRINT_CHECKS, FORMAT_V1, VerifiedBundle, verify_bundle
from ledger.evidence_format import load_bundle
from ledger.fingerprint_facts import FingerprintFacts
from ledger.small_file import read_small_file

NOT_PINNED = (
    "the log key was NOT pinned: it was taken from the bundle itself, so this only shows the "
    "bundle is self-consistent; anyone can make such a bundle. Pin the log key with --log-key "
    "(`ledger keys show-log`, GET /v1/log/key) to rule out a forged log."
)
# Far above a bundle of a record at the ledger's largest request body; /dev/zero is not one.
BUNDLE_FILE_LIMIT = 256 << 20
NO_PIN = (
    "no log key pinned: pass --log-key FILE, the log's public key obtained out of band "
    "(`ledger keys show-log` on the ledger host, or GET /v1/log/key), or "
    "--trust-bundled-log-key to check the bundle against the key it carries (which proves "
    "nothing against a forged log)"
)
NO_FINGERPRINT = (
    f"not included: bundles of format {FORMAT_V1} do not carry the record's fingerprint, so "
    "which model, engine and GPU produced it is not checked; export the evidence again "
    "(`ledger evidence`) for a bundle that does"
)


def verify(
    bundle: Path = typer.Argument(..., help="evidence bundle (JSON)"),
    log_key: Path | None = typer.Option(
        None, "--log-key", help="the log's public key (PEM), pinned out of band"
    ),
    trust_bundled_log_key: bool = typer.Option(
        False,
        "--trust-bundled-log-key",
        help="verify without a pinned log key, against the key the bundle carries (unsafe: "
        "proves self-consistency only)",
    ),
    as_json: bool = JsonOption,
) -> None:
    """Verify a bundle offline: JCS, signatures, inclusion proofs, checkpoint, keys, fingerprint.

    Exit 0 when valid; exit 1 naming the check that failed; exit 2 without a pinned log key
    (--log-key) unless --trust-bundled-log-key is given.
    """
    if log_key is None and not trust_bundled_log_key:
        if as_json:
            print_json({"valid": False, "code": "log_key_not_pinned", "message": NO_PIN})
            raise typer.Exit(2)
        fail(NO_PIN, 2)
    if log_key is not None and trust_bundled_log_key:
        fail("--log-key and --trust-bundled-log-key exclude each other", 2)
    try:
        data = read_small_file(bundle, "bundle", limit=BUNDLE_FILE_LIMIT)
    except LedgerError as exc:
        fail(f"{exc.message} [{exc.code}]")
    pinned = read_public_key(log_key) if log_key is not None else None
    try:
        result = verify_bundle(load_bundle(data), pinned)
    except VerificationError as exc:
        check = exc.details.get("check", "unknown")
        if as_json:
            print_json({"valid": False, "check": check, "code": exc.code, "message": exc.message})
        else:
            # the verdict is the command's output, valid or not (the exit status tells which)
            console.print(
                f"[bold red]INVALID[/] check failed: [bold]{check}[/] — {escape(exc.message)}"
            )
        raise typer.Exit(1) from None
    if as_json:
        print_json(_as_json(result))
    else:
        _print(result)


def _as_json(result: VerifiedBundle) -> dict[str, Any]:
    out: dict[str, Any] = {
        "valid": True,
        "format": result.format,
        "checks": list(result.checks),
        "skipped_checks": [c for c in FINGERPRINT_CHECKS if c not in result.checks],
        "request_id": result.request_id,
        "leaf_index": result.leaf_index,
        "tree_size": result.tree_size,
        "origin": result.origin,
        "checkpoint_signed_at": when_json(result.checkpoint_signed_at),
        "collector_key_id": result.collector_key_id,
        "collector_key_name": result.collector_name,
        "collector_key_role": result.collector_role,
        "collector_key_pools": (
            list(result.collector_pools) if result.collector_pools is not None else None
        ),
        "log_key_id": result.log_key_id,
        "log_key_pinned": result.log_key_pinned,
        "fingerprint": result.fingerprint.to_dict() if result.fingerprint else None,
        "replay_verdicts": list(result.replay_verdicts),
        "replays": [r.to_dict() for r in result.replays],
        **result.content.to_dict(),
    }
    if result.fingerprint is None:
        out["fingerprint_note"] = NO_FINGERPRINT
    if not result.log_key_pinned:
        out["warning"] = NOT_PINNED
    return out


def _shown(value: str | None, missing: str = "not recorded in the fingerprint") -> str:
    """A value from a signed document, safe to print: no markup, no control characters."""
    if value is None:
        return f"[dim]({missing})[/]"
    return shown(value)


def _gpus(fp: FingerprintFacts) -> str:
    if not fp.gpus:
        return _shown(None, f"none: {fp.gpus_unknown}" if fp.gpus_unknown else "none reported")
    named = Counter("(name not recorded)" if n is None else n for n in fp.gpus)
    names = ", ".join(f"{n} x{k}" if k > 1 else n for n, k in named.items())
    driver = f" (driver {fp.driver_version})" if fp.driver_version else ""
    return _shown(names + driver)


def _print_content(result: VerifiedBundle) -> None:
    content = result.content
    if content.schema_version == 1:
        console.print("  content: in the signed record itself (schema v1: not erasable)")
        return
    console.print(f"  content (schema v{content.schema_version}, one digest per member):")
    rows = [
        (
            item.member or "(member hidden by its salt)",
            {"disclosed": "disclosed", "redacted": "redacted in this bundle"}.get(
                item.status, "[bold]erased[/]"
            ),
            item.digest,
        )
        for item in content.items
    ]
    for member, status, digest in rows:
        console.print(f"    {escape(member):<28} {status:<24} {digest}")
    e = content.erasure
    if e is not None:
        console.print(
            f"  erased by event at leaf {e.leaf_index} ({_shown(e.reason_code, '?')}: "
            f"{_shown(e.reason, '?')}; by {_shown(e.requested_by, '?')} at "
            f"{_shown(e.erased_at, '?')}), signed by the log key"
        )


def _print(result: VerifiedBundle) -> None:
    pinned = "" if result.log_key_pinned else " [bold red](LOG KEY NOT PINNED)[/]"
    console.print(f"[bold green]VALID[/] {result.kind} {escape(str(result.request_id))}{pinned}")
    console.print(f"  leaf {result.leaf_index} of {result.tree_size} in {_shown(result.origin)}")
    pools = result.collector_pools
    scope = "any pool" if pools is None else "pools " + ", ".join(pools) if pools else "no pool"
    console.print(
        f"  signed by collector key {result.collector_key_id} "
        f"({_shown(result.collector_name)}, {_shown(result.collector_role)}, "
        f"registered for {_shown(scope)})"
    )
    at = result.checkpoint_signed_at
    signed = f" at {when(at)}" if at else " (no signed timestamp)"
    console.print(f"  checkpoint signed by log key {result.log_key_id}{signed}")
    fp = result.fingerprint
    if fp is None:
        console.print(f"  fingerprint: [bold yellow]{escape(NO_FINGERPRINT)}[/]")
    else:
        console.print(
            f"  fingerprint {fp.fingerprint_id} (leaf {fp.leaf_index}, "
            f"signed by collector key {fp.signer_key_id})"
        )
        engine = " ".join(v for v in (fp.engine_name, fp.engine_version) if v) or None
        rows = [
            ("model digest", _shown(fp.model_digest)),
            ("engine", _shown(engine)),
            ("GPUs", _gpus(fp)),
            ("batch invariance", _shown(fp.batch_invariance)),
        ]
        for label, value in rows:
            console.print(f"    {label:<17}{value}")
    for r in result.replays:
        worker = f" on worker {r.worker_id}" if r.worker_id else ""
        key = f" (key {r.worker_key_id})" if r.worker_key_id else ""
        console.print(
            f"  replay {_shown(r.replay_id, '?')}: {_shown(r.verdict, '?')}{_shown(worker + key)} "
            f"(leaf {r.leaf_index}, signed by the log key)"
        )
    _print_content(result)
    if not result.log_key_pinned:
        console.print(f"  [bold red]WARNING:[/] {escape(NOT_PINNED)}")
        err_console.print(f"[bold red]warning:[/] {escape(NOT_PINNED)}")
