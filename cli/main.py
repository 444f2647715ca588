"""``ledger``: one Typer app; each sub-command lives in its own module."""

from __future__ import annotations

import typer

from cli import (
    audit,
    certify,
    collect,
    db,
    demo,
    diff,
    evidence,
    fingerprint,
    fixture_model,
    gpu_check,
    keys,
    replay,
    serve,
    tokens,
    verify,
)

app = typer.Typer(
    name="ledger",
    help="Fingerprint and audit-trail ledger for self-hosted LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("serve")(serve.serve)
app.command("demo")(demo.demo)
app.command("verify")(verify.verify)
app.command("audit")(audit.run_audit)
app.command("evidence")(evidence.evidence)
app.command("fixture-model")(fixture_model.fixture_model)
app.command("fingerprint")(fingerprint.fingerprint)
app.command("diff")(diff.diff_command)
app.command("collect")(collect.collect)
app.command("replay")(replay.replay)
app.command("certify")(certify.certify)
app.command("gpu-check")(gpu_check.gpu_check)
app.add_typer(db.app, name="db")
app.add_typer(keys.app, name="keys")
app.add_typer(tokens.app, name="tokens")


def main() -> None:
    app()
