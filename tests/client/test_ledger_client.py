"""The API client the CLI and collectors use: IDs stay one path segment, bad URLs are input
errors (one line from the CLI), never a traceback."""

from __future__ import annotations

import uuid

import pytest

from client.ledger_client import LedgerClient, segment
from ledger.errors import InvalidInput, NotFound
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
