"""Token expiry: stored, listed, and enforced at authentication over real HTTP on both
backends, by an API whose token cache would otherwise trust a token for 30 s."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from api.app import create_app
from api.bootstrap import bootstrap
from api.settings import Settings
from api.state import TokenCache
from demo.server_thread import ServerThread, free_port
from ledger.errors import AuthenticationError, InvalidInput
from ledger.storage import tokenstore
from ledger.storage.database import Database
from ledger.tokens import Principal, parse_expiry
from tests.support.cli import ledger
from tests.support.http import assert_error

CACHE_SECONDS = 30.0


@pytest.fixture
def cached_api(db: Database, tmp_path: Path) -> Iterator[tuple[str, Database]]:
    """A live API on a fresh database (each backend) with a 30 s token cache."""
    settings = Settings(data_dir=tmp_path, database_url=db.url, token_cache_seconds=CACHE_SECONDS)
    boot = bootstrap(settings, db)
    server = ServerThread(create_app(settings, db, boot.log_key), "127.0.0.1", free_port())
    server.start()
    yield server.url, db
    server.stop()


def get_keys(url: str, secret: str) -> httpx.Response:
    return httpx.get(url + "/v1/keys", headers={"Authorization": f"Bearer {secret}"}, timeout=30)


def test_a_cached_token_stops_working_at_its_expiry(cached_api: tuple[str, Database]):
    url, db = cached_api
    # 8 s: the four requests before the expiry must be answered before it, on a loaded host too
    expires = datetime.now(UTC) + timedelta(seconds=8)
    short, info = tokenstore.create_token(db, "short", ["records:read"], expires)
    assert info.expires_at == expires
    forever, forever_info = tokenstore.create_token(db, "forever", ["records:read"])
    assert get_keys(url, short).status_code == 200  # verified, now in the cache for 30 s
    assert get_keys(url, forever).status_code == 200
    # the cache is in force: a revocation is not seen within its 30 s ...
    tokenstore.revoke_token(db, forever_info.token_id)
    assert get_keys(url, forever).status_code == 200
    # ... but an expiry is: the cached token fails from the instant it expires
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.2)
    err = assert_error(get_keys(url, short), 401, "token_expired")
    assert err["details"]["token_id"] == info.token_id and "expired at" in err["message"]
    assert_error(get_keys(url, short), 401, "token_expired")  # and stays refused


def test_an_expired_token_is_refused_by_the_store_and_revocation_still_wins(db: Database):
    expires = datetime.now(UTC) + timedelta(seconds=4)
    secret, info = tokenstore.create_token(db, "brief", ["admin"], expires)
    principal = tokenstore.authenticate(db, secret)
    assert principal.expires_at == expires and not principal.expired(datetime.now(UTC))
    listed = {t.token_id: t for t in tokenstore.list_tokens(db)}
    assert listed[info.token_id].expires_at == expires  # stored as given, aware UTC
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.2)
    with pytest.raises(AuthenticationError) as err:
        tokenstore.authenticate(db, secret)
    assert err.value.code == "token_expired"
    tokenstore.revoke_token(db, info.token_id)
    with pytest.raises(AuthenticationError) as err:
        tokenstore.authenticate(db, secret)
    assert err.value.code == "invalid_token"


def test_an_expiry_must_be_in_the_future(db: Database):
    for when in (datetime.now(UTC) - timedelta(seconds=1), datetime(2030, 1, 1)):
        with pytest.raises(InvalidInput) as err:
            tokenstore.create_token(db, "x", ["admin"], when)
        assert err.value.code == "invalid_expiry"
    assert tokenstore.count_tokens(db) == 0


def test_token_cache_never_returns_a_principal_past_its_expiry():
    cache = TokenCache(ttl=3600)
    now = datetime.now(UTC)
    cache.put("a", Principal("a", "a", ("admin",), now + timedelta(hours=1)))
    cache.put("b", Principal("b", "b", ("admin",), now - timedelta(microseconds=1)))
    cache.put("c", Principal("c", "c", ("admin",)))
    assert cache.get("a") is not None and cache.get("c") is not None
    assert cache.get("b") is None


def test_expiry_forms():
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert parse_expiry("30d", now) == now + timedelta(days=30)
    assert parse_expiry("2w", now) == now + timedelta(weeks=2)
    assert parse_expiry("12h", now) == now + timedelta(hours=12)
    assert parse_expiry("90m", now) == now + timedelta(minutes=90)
    assert parse_expiry("3600s", now) == now + timedelta(hours=1)
    assert parse_expiry("2027-01-31T00:00:00Z", now) == datetime(2027, 1, 31, tzinfo=UTC)
    assert parse_expiry("2027-01-31t02:00:00.5+02:00", now) == datetime(
        2027, 1, 31, 0, 0, 0, 500000, tzinfo=UTC
    )
    for bad in (
        "0d",
        "-1d",
        "1.5d",
        "1e9",
        "30",
        "d",
        "inf",
        "nan",
        "2027-01-31",  # no time
        "2027-01-31T00:00:00",  # no zone
        "2027-02-30T00:00:00Z",
        "2027-01-31T00:00:00+24:00",
        "2099-01-31T00:00:00+00:60",  # no minute 60 in an offset (datetime reads +01:00)
        "2099-01-31T00:00:00-05:99",
        "2026-12-01T11:59:59Z",  # past
        "2026-12-01T12:00:00Z",  # now
        "9999-12-31T23:59:59-01:00",  # beyond the calendar
        "99999999999d",
        "9999999999w",
    ):
        with pytest.raises(InvalidInput) as err:
            parse_expiry(bad, now)
        assert err.value.code == "invalid_expiry", bad


def test_an_expiry_past_the_calendar_or_an_impossible_date_says_so():
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    for beyond in ("9999-12-31T23:59:59-14:00", "9999999999w"):
        with pytest.raises(InvalidInput, match="after 9999-12-31T23:59:59Z"):
            parse_expiry(beyond, now)
    with pytest.raises(InvalidInput, match="day is out of range"):
        parse_expiry("2027-02-30T00:00:00Z", now)
    with pytest.raises(InvalidInput, match="before 0001-01-01T00:00:00Z"):
        parse_expiry("0001-01-01T00:00:00+01:00", now)  # before the calendar, not after it
    with pytest.raises(InvalidInput, match="minutes are over 59"):
        parse_expiry("2099-01-31T00:00:00+00:99", now)


def test_tokens_cli_expires_and_lists_expiry(tmp_path: Path):
    db = ["--db", f"sqlite:///{tmp_path / 'l.db'}"]
    ledger("db", "upgrade", *db)
    made = json.loads(
        ledger("tokens", "create", "--scope", "admin", "--expires", "30d", *db, "--json").stdout
    )
    expires = datetime.fromisoformat(made["expires_at"])
    assert abs(expires - (datetime.now(UTC) + timedelta(days=30))) < timedelta(minutes=5)
    pinned = json.loads(
        ledger(
            "tokens", "create", "--scope", "admin", "--expires", "2099-01-01T00:00:00Z", *db,
            "--json",
        ).stdout
    )  # fmt: skip
    assert pinned["expires_at"] == "2099-01-01T00:00:00.000000Z"
    plain = json.loads(ledger("tokens", "create", "--scope", "admin", *db, "--json").stdout)
    assert plain["expires_at"] is None
    listed = {t["token_id"]: t for t in json.loads(ledger("tokens", "list", *db, "--json").stdout)}
    assert listed[made["token_id"]]["expires_at"] == made["expires_at"]
    assert listed[pinned["token_id"]]["expires_at"] == "2099-01-01T00:00:00.000000Z"
    assert listed[plain["token_id"]]["expires_at"] is None
    assert not any(t["expired"] for t in listed.values())
    table = ledger("tokens", "list", *db, env={"COLUMNS": "200"}).stdout
    assert "expires" in table and "2099-01-01T00:00:00" in table
    for bad, words in [
        ("yesterday", "invalid expiry"),
        ("2020-01-01T00:00:00Z", "not in the future"),
    ]:
        proc = ledger("tokens", "create", "--scope", "admin", "--expires", bad, *db, check=False)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr
    assert len(json.loads(ledger("tokens", "list", *db, "--json").stdout)) == 3


def test_a_token_is_told_what_the_ledger_makes_of_it(cached_api: tuple[str, Database]):
    """GET /v1/tokens/self: any valid token learns its ID, name, scopes and expiry, never its
    secret; an unknown or expired token is refused as on every route."""
    url, db = cached_api
    expires = datetime.now(UTC) + timedelta(seconds=6)
    brief, info = tokenstore.create_token(db, "ingest-a", ["records:write"], expires)
    reader, reader_info = tokenstore.create_token(db, "reader", ["records:read", "holds"])

    def me(secret: str | None) -> httpx.Response:
        auth = {"Authorization": f"Bearer {secret}"} if secret else {}
        return httpx.get(url + "/v1/tokens/self", headers=auth, timeout=30)

    got = me(brief)
    assert got.status_code == 200, got.text
    assert got.json() == {
        "token_id": info.token_id,
        "name": "ingest-a",
        "scopes": ["records:write"],
        "expires_at": expires.isoformat(timespec="microseconds").replace("+00:00", "Z"),
    }
    assert brief not in got.text
    assert me(reader).json() == {
        "token_id": reader_info.token_id,
        "name": "reader",
        "scopes": ["holds", "records:read"],  # as stored: sorted
        "expires_at": None,
    }
    assert_error(me(None), 401, "missing_token")
    assert_error(me("lgr_" + "x" * 40), 401, "invalid_token")
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.2)
    assert_error(me(brief), 401, "token_expired")
