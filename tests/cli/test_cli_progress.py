"""Progress displays (cli/progress.py) draw on stderr only where it is a terminal: piped, or in
a CI log, a command's stderr holds nothing but what it means to say. (``ledger audit``'s is
checked in test_cli_contract.py.)"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from cli.progress import DelayedByteProgress


def _run(*args: str) -> int:
    try:
        main(list(args))
    except SystemExit as done:
        return int(done.code or 0)
    return 0


def test_fingerprint_hashing_draws_nothing_on_a_stderr_that_is_no_terminal(
    fixture_models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    # The bar would appear at once (not after a second), were stderr a terminal.
    monkeypatch.setattr(
        "cli.fingerprint.DelayedByteProgress", functools.partial(DelayedByteProgress, delay=0)
    )
    model = str(fixture_models["small"])
    cache = str(tmp_path / "digests.sqlite")
    status = _run("fingerprint", "--model-dir", model, "--digest-cache", cache, "--json")
    out, err = capsys.readouterr()
    assert status == 0, err
    assert json.loads(out)["fingerprint_id"].startswith("sha256:")
    assert err == ""


class _Certifications:
    """A ledger whose certification job runs for one poll, then is done and invariant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _Certifications:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def certify(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {
            "certification_id": "c-1",
            "pool": payload["pool"],
            "status": "running",
            "done": 0,
            "total": 2,
        }

    def certification(self, job_id: str) -> dict[str, Any]:
        body = {
            "pool": "p1",
            "worker_id": "w-1",
            "batch_invariance": "serial",
            "invariant_observed": True,
            "certificate_id": "cert-1",
            "fingerprint_id": "sha256:" + "0" * 64,
            "results": [
                {
                    "max_tokens": 16,
                    "concurrency": 1,
                    "requests": 2,
                    "exact_token_rate": 1.0,
                    "bitwise_rate": 1.0,
                    "first_divergences": [],
                    "min_margin": 0.5,
                    "min_margin_at_divergence": None,
                }
            ],
        }
        return {
            "certification_id": job_id,
            "pool": "p1",
            "status": "done",
            "done": 2,
            "total": 2,
            "log_index": 7,
            "envelope": {"body": body},
        }


def test_certify_draws_nothing_on_a_stderr_that_is_no_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setattr("cli.certify.LedgerClient", _Certifications)
    token = tmp_path / "token"
    token.write_text("test-token\n")
    status = _run("certify", "--pool", "p1", "--token-file", str(token))
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "certificate cert-1" in out
    assert err == ""
