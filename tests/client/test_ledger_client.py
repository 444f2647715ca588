"""The API client the CLI and collectors use: IDs stay one path segment, bad URLs are input
errors (one line from the CLI), never a traceback."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from client.cache_backends.lookup import LedgerLookup
from client.ledger_client import LedgerClient, segment
from ledger.errors import InvalidInput, NotFound, Pushback
from tests.support.harness import Harness


def test_an_id_is_sent_as_one_path_segment(api: Harness):
    key, fp = api.setup_collector()
    target = f"target-{uuid.uuid4().hex[:8]}"
    assert api.post([api.record(key, fp, request_id=target)]).status_code == 201
    with LedgerClient(api.url, api.admin_token) as client:
        assert client.get_record(target)["request_id"] == target
        # Read as a path, these would name the record above; as one segment, they name none
        # (the API refuses an ID with such characters, or finds no record under it).
        for tricky in (f"x/../{target}", f"./{target}", f"{target}?x=1", f"{target}#f"):
            with pytest.raises((NotFound, InvalidInput)):
                client.get_record(tricky)
            with pytest.raises((NotFound, InvalidInput)):
                client.evidence(tricky)


@pytest.mark.parametrize("bad", ["", ".", ".."])
def test_dot_segments_and_empty_ids_are_refused_before_any_request(bad: str):
    with pytest.raises(InvalidInput) as err:
        segment(bad)
    assert err.value.code == "invalid_id"
    with LedgerClient("http://127.0.0.1:9") as client, pytest.raises(InvalidInput):
        client.evidence(bad)  # nothing listens on port 9: refused before connecting


@pytest.mark.parametrize("url", ["http://256.1.1.1:8700", "http://[::1"])
def test_an_unusable_ledger_url_is_an_input_error(url: str):
    with pytest.raises(InvalidInput) as err, LedgerClient(url, "t") as client:
        client.get_record("x")
    assert err.value.code == "invalid_url"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://127.0.0.1:9", "must be http or https"),
        ("http://user:pw@127.0.0.1:9", "userinfo"),
        ("127.0.0.1:8700", "must be http or https"),
        ("http://127.0.0.1:9/?x=1", "query"),
    ],
)
def test_a_ledger_url_that_is_not_http_or_holds_credentials_is_refused_before_connecting(
    url: str, why: str
):
    with pytest.raises(InvalidInput, match=why) as err:
        LedgerClient(url, "t")
    assert err.value.code == "invalid_url"


@pytest.mark.parametrize(
    "body",
    [
        b"{}",
        b"not json",
        b"[]",
        b'{"leaf_index": "[bold green]VALID[/]", "inclusion_proof": {"tree_size": 9}}',
        b'{"leaf_index": 1, "inclusion_proof": {"tree_size": 9}, "fingerprint": "x"}',
    ],
)
def test_ledger_evidence_refuses_an_answer_that_is_not_a_bundle_and_writes_nothing(
    tmp_path: Path, body: bytes
):
    """A proxy's page, another service or a hostile server answering 200: one error line,
    exit 2, no file written, nothing of the answer printed as console markup."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from demo.server_thread import ServerThread, free_port
    from tests.support.cli import ledger

    async def answer(_: object) -> Response:
        return Response(body, media_type="application/json")

    app = Starlette(routes=[Route("/v1/records/{rid}/evidence", answer)])
    server = ServerThread(app, "127.0.0.1", free_port()).start()
    try:
        token = tmp_path / "t.token"
        token.write_text("tok\n")
        out = tmp_path / "b.json"
        args = ["evidence", "req-1", "-o", str(out), "--api", server.url]
        proc = ledger(*args, "--token-file", str(token), check=False)
    finally:
        server.stop()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "[unexpected_answer]" in proc.stderr and "this is a bug" not in proc.stderr
    assert not out.exists()


def test_a_ledger_that_reads_the_request_slowly_is_given_up_on_at_the_deadline():
    """A server that takes a few KiB of the body at a time and never answers: httpx's write
    timeout bounds each send only, so without a deadline it holds this request for most of a
    minute. With a deadline the client gives up at it, with ``ledger_too_slow``."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the accepted socket's
    done = threading.Event()

    def read_slowly() -> None:
        conn, _ = listener.accept()
        with conn:
            while not done.wait(0.05) and conn.recv(65536):
                pass

    threading.Thread(target=read_slowly, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        with LedgerClient(url, "t", deadline=1.0) as client, pytest.raises(Pushback) as err:
            started = time.monotonic()
            client.post_fingerprint(b" " * (4 << 20))
        elapsed = time.monotonic() - started
    finally:
        done.set()
        listener.close()
    assert err.value.code == "ledger_too_slow", err.value.message
    assert 1.0 <= elapsed < 2.0, elapsed


@pytest.mark.parametrize(
    "token", ["S3CR3T\nX-Evil: 1", "S3CR3T\r\n\r\nGET /", "S3CR3T\x00x", "S3CR3T x", " "]
)
def test_a_token_that_is_no_bearer_token_is_refused_and_never_quoted(token: str):
    """Sent as it is, httpx would refuse the header and quote it in its error, which a cache
    backend logs as a warning: refused when the client is made, without the token."""
    for make in (LedgerClient, LedgerLookup):
        with pytest.raises(InvalidInput) as err:
            make("http://127.0.0.1:9", token, pool="p") if make is LedgerLookup else make(
                "http://127.0.0.1:9", token
            )
        assert err.value.code == "no_token"
        assert "S3CR3T" not in err.value.message


def test_a_token_read_with_its_line_end_is_sent_without_it(api: Harness):
    """``open("cache.token").read()`` keeps the file's newline: the token is the line."""
    request = {"model": "m", "prompt": "x", "temperature": 0}
    with LedgerClient(api.url, api.admin_token + "\n") as client:
        assert client.pools() is not None
    answer = LedgerLookup(api.url, api.admin_token + "\n", pool="p").lookup(
        "/v1/completions", request
    )
    assert answer.reason != "error" or "401" not in answer.message, answer.message


def trickling_server() -> tuple[str, threading.Event]:
    """A server that sends an answer's headers, then one byte of its body every 0.2 s: each
    read is within any per-read timeout, and the answer never ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100000\r\n\r\n"
                )
                while not stop.wait(0.2):
                    try:
                        conn.sendall(b" ")
                    except OSError:
                        break
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", stop


def test_a_cache_lookup_is_a_miss_at_its_timeout_however_slowly_the_ledger_answers():
    """``timeout`` bounds the whole lookup (sync and async), not each read: the application's
    call goes on to the model at the timeout with a miss, never waits on a trickling ledger."""
    url, stop = trickling_server()
    request = {"model": "m", "prompt": "x", "temperature": 0}
    try:
        lookup = LedgerLookup(url, "tok", pool="p", timeout=1.0)
        for run in (
            lambda: lookup.lookup("/v1/completions", request),
            lambda: asyncio.run(lookup.alookup("/v1/completions", request)),
        ):
            started = time.monotonic()
            answer = run()
            elapsed = time.monotonic() - started
            assert not answer.hit and answer.reason == "error"
            assert "did not answer within 1 s" in answer.message, answer.message
            assert 1.0 <= elapsed < 3.0, elapsed
    finally:
        stop.set()


@pytest.mark.parametrize("timeout", [None, 0, -1, float("inf"), float("nan"), "5", True])
def test_a_lookup_timeout_is_a_number_of_seconds(timeout: object):
    """It bounds each lookup in all: refused when the cache is made, never a TypeError from a
    lookup (which would break the application's call)."""
    with pytest.raises(InvalidInput) as err:
        LedgerLookup("http://127.0.0.1:9", "tok", pool="p", timeout=timeout)  # type: ignore[arg-type]
    assert err.value.code == "invalid_parameters"


def test_a_lookup_reads_the_certificate_variables_when_it_is_made(
    monkeypatch: pytest.MonkeyPatch,
):
    """No proxy from the environment, but the CAs SSL_CERT_FILE names are the ones the
    ledger's certificate is checked against, read when the cache is made: a lookup (sync or
    async) never fails on them later, it misses."""
    monkeypatch.setenv("SSL_CERT_FILE", "/nonexistent/ca.pem")
    with pytest.raises(FileNotFoundError):
        LedgerLookup("https://127.0.0.1:9", "tok", pool="p")
    monkeypatch.delenv("SSL_CERT_FILE")
    lookup = LedgerLookup("https://127.0.0.1:9", "tok", pool="p", timeout=2.0)
    monkeypatch.setenv("SSL_CERT_FILE", "/nonexistent/ca.pem")
    for answer in (
        lookup.lookup("/v1/completions", {"prompt": "x"}),
        asyncio.run(lookup.alookup("/v1/completions", {"prompt": "x"})),
    ):
        assert answer.reason == "error" and "cannot reach the ledger" in answer.message
