"""`ledger collect` checks its token before it starts (collectors.collector.check_token):
only the ledger's own refusals stop it; what is not the ledger's answer (a proxy's 401, an
older ledger's 404, an answer without scopes) is a warning, and the collector starts."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from collectors.collector import CollectorConfig, check_token
from ledger.errors import AuthenticationError, PermissionDenied
from ledger.signing import SigningKey

SECRET = "lgr_" + "s" * 40


def _answering(status: int, body: bytes, content_type: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            assert self.path == "/v1/tokens/self"
            assert self.headers["Authorization"] == f"Bearer {SECRET}"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def ledger_answering() -> Iterator[object]:
    servers: list[ThreadingHTTPServer] = []

    def start(status: int, answer: object, content_type: str = "application/json") -> str:
        body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        server = ThreadingHTTPServer(("127.0.0.1", 0), _answering(status, body, content_type))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _config(url: str) -> CollectorConfig:
    return CollectorConfig(
        engine_url="http://127.0.0.1:1",
        ledger_url=url,
        ledger_token=SECRET,
        key=SigningKey.generate(),
        pool="p",
        worker_id="w",
        model_dir=Path("/nonexistent"),
        spool_path=Path("/nonexistent/spool.sqlite"),
    )


def _error(code: str) -> dict[str, object]:
    return {"error": {"code": code, "message": "the bearer token is not valid"}}


@pytest.mark.parametrize("code", ["invalid_token", "token_expired", "missing_token"])
def test_the_ledgers_refusal_stops_the_start(ledger_answering, code: str):  # type: ignore[no-untyped-def]
    with pytest.raises(AuthenticationError) as err:
        check_token(_config(ledger_answering(401, _error(code))))
    assert err.value.code == code and "refuses this collector's token" in err.value.message
    assert SECRET not in err.value.message


@pytest.mark.parametrize(
    ("scopes", "refused"),
    [
        (["records:read", "cache:read"], True),
        (["records:write"], False),
        (["admin"], False),
        (["holds", "records:write"], False),
    ],
)
def test_a_token_that_may_not_write_records_stops_the_start(  # type: ignore[no-untyped-def]
    ledger_answering, scopes: list[str], refused: bool
):
    url = ledger_answering(200, {"token_id": "t", "name": "w1", "scopes": scopes})
    if not refused:
        check_token(_config(url))
        return
    with pytest.raises(PermissionDenied) as err:
        check_token(_config(url))
    assert err.value.code == "insufficient_scope" and "'w1'" in err.value.message


@pytest.mark.parametrize(
    ("status", "answer", "content_type", "said"),
    [
        (401, b"<html>Authorization Required</html>", "text/html", "not checked"),
        (401, _error("proxy_says_no"), "application/json", "not checked"),
        (404, {"detail": "Not Found"}, "application/json", "answers 404"),
        (200, {"scopes": "records:write"}, "application/json", "names no scopes"),
        (200, b"[1, 2]", "application/json", "names no scopes"),
    ],
)
def test_an_answer_that_is_not_the_ledgers_is_a_warning_not_a_refusal(  # type: ignore[no-untyped-def]
    ledger_answering, caplog, status: int, answer: object, content_type: str, said: str
):
    url = ledger_answering(status, answer, content_type)
    with caplog.at_level(logging.WARNING, logger="ledger.collector"):
        check_token(_config(url))
    assert any(said in r.getMessage() for r in caplog.records), caplog.text
    assert SECRET not in caplog.text


def test_a_ledger_away_is_no_reason_not_to_start(caplog):  # type: ignore[no-untyped-def]
    with caplog.at_level(logging.INFO, logger="ledger.collector"):
        check_token(_config("http://127.0.0.1:1"))
    assert "not checked at start" in caplog.text
