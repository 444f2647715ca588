"""Read paths serve only what the log holds (issue 17, part 3), over real HTTP, on SQLite and
Postgres: a database superuser who edits an index row (records, cache keys, fingerprints) with
the append-only triggers out of the way can at most hide a record, never make search, a record
read or a cache lookup state something false; aborted, non-deterministic and tier-0 records
are never cache hits; every malformed query parameter is a 422; the ``cache:read`` scope.

Each backend gets its own ledger (the edits would otherwise reach other modules' tests).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from ledger.cachekey import CHAT, COMPLETIONS, cache_key
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.records import RECORD_KIND, Choice, build_record_body
from ledger.signing import SigningKey, sign_envelope
from ledger.storage import queries
from tests.conftest import BACKENDS, fresh_url
from tests.support.cli import ledger
from tests.support.documents import record_body
from tests.support.harness import Harness, start_harness
from tests.support.http import assert_error

GREEDY = {"temperature": 0}
# What a record's members are, by request ID: taken from the envelopes these tests signed.
TRUTH: dict[str, dict[str, Any]] = {}
ENVELOPES: dict[str, bytes] = {}


@pytest.fixture(scope="module", params=BACKENDS)
def h(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    backend = request.param
    harness = start_harness(
        backend, fresh_url(request, backend), tmp_path_factory.mktemp(f"read-paths-{backend}")
    )
    yield harness
    harness.close()


def superuser(h: Harness, tables: tuple[str, ...], *statements: tuple[str, dict[str, Any]]) -> None:
    """Run statements as a database superuser with the append-only triggers out of the way
    (Postgres: disabled for the transaction, as tests/ledger/test_tamper.py does; SQLite:
    dropped and re-created), in one transaction."""
    with h.db.write() as s:
        if h.db.is_postgres:
            s.execute(text("SET LOCAL session_replication_role = replica"))  # and FK checks
            for t in tables:
                s.execute(text(f"ALTER TABLE {t} DISABLE TRIGGER USER"))
            for stmt, params in statements:
                s.execute(text(stmt), params)
            for t in tables:
                s.execute(text(f"ALTER TABLE {t} ENABLE ALWAYS TRIGGER {t}_append_only"))
                s.execute(text(f"ALTER TABLE {t} ENABLE ALWAYS TRIGGER {t}_no_truncate"))
            return
        triggers = [
            (name, sql)
            for t in tables
            for name, sql in s.execute(
                text(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = :t"
                ),
                {"t": t},
            )
        ]
        assert triggers
        s.execute(text("PRAGMA defer_foreign_keys = ON"))  # checked at commit: swaps pass
        for name, _ in triggers:
            s.execute(text(f"DROP TRIGGER {name}"))
        for stmt, params in statements:
            s.execute(text(stmt), params)
        for _, sql in triggers:
            s.execute(text(sql))


def post(h: Harness, key: SigningKey, *bodies: dict[str, Any]) -> list[tuple[str, int]]:
    """Sign and ingest record bodies; remember what each record is. (request ID, log index)."""
    envs = [sign_envelope(RECORD_KIND, b, key) for b in bodies]
    resp = h.post(envs)
    assert resp.status_code == 201, resp.text
    out = []
    for env, result in zip(envs, resp.json()["results"], strict=True):
        b = env.body
        rid, idx = b["request_id"], result["log_index"]
        TRUTH[rid] = {
            "request_id": rid,
            "log_index": idx,
            "content_hash": env.body_digest,
            "fingerprint_id": b["fingerprint_id"],
            "key_id": env.key_id,
            "model": b["model"],
            "tier": b["tier"],
            "pool": b["pool"],
            "worker_id": b["worker_id"],
            "endpoint": b["endpoint"],
            "aborted": b.get("aborted", False),
        }
        ENVELOPES[rid] = env.canonical
        out.append((rid, idx))
    return out


def truthful(item: dict[str, Any]) -> dict[str, Any]:
    """Assert a served record says exactly what its envelope says; return that truth."""
    truth = TRUTH[item["request_id"]]
    assert {k: item[k] for k in truth} == truth
    if "envelope" in item:
        assert json.loads(ENVELOPES[item["request_id"]]) == item["envelope"]
    received = datetime.fromisoformat(item["received_at"])
    assert datetime(2020, 1, 1, tzinfo=UTC) < received <= datetime.now(UTC)
    return truth


def search(c: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    """Every item a search returns, following next_cursor; each checked truthful and, as
    its envelope says, inside the filters."""
    items: list[dict[str, Any]] = []
    cursor = None
    for _ in range(1000):
        resp = c.get("/v1/records", params={**params, **({"cursor": cursor} if cursor else {})})
        assert resp.status_code == 200, resp.text
        page = resp.json()
        assert page["count"] == len(page["items"])
        for item in page["items"]:
            truth = truthful(item)
            for name in ("model", "pool", "fingerprint_id"):
                if name in params:
                    assert truth[name] == params[name]
            if "tier" in params:
                assert truth["tier"] == int(params["tier"])
            if "until" in params:
                assert datetime.fromisoformat(item["received_at"]) < datetime.fromisoformat(
                    params["until"]
                )
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    indexes = [i["log_index"] for i in items]
    assert indexes == sorted(set(indexes))  # log order, each record once
    return items


def ids(items: list[dict[str, Any]]) -> list[str]:
    return [i["request_id"] for i in items]


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# --- records: every index column -------------------------------------------------------------


# column -> (forged value; the search filter that the forgery tries to satisfy, or None)
def _forgeries(other_fp: str, other_key: str) -> dict[str, tuple[Any, dict[str, Any] | None]]:
    return {
        "tier": (2, {"tier": 2}),
        "model": ("forged-model", {"model": "forged-model"}),
        "pool": ("forged-pool", {"pool": "forged-pool"}),
        "fingerprint_id": (other_fp, {"fingerprint_id": other_fp}),
        "received_at": (datetime(2000, 1, 1, tzinfo=UTC), {"until": "2001-01-01T00:00:00Z"}),
        "worker_id": ("forged-worker", None),
        "endpoint": (CHAT, None),
        "key_id": (other_key, None),
        "content_hash": ("sha256:" + "0" * 64, None),
    }


@pytest.mark.parametrize("column", list(_forgeries("", "")))
def test_an_edited_records_column_can_hide_a_record_never_misstate_it(h: Harness, column: str):
    key, fp = h.setup_collector()
    other_key, other_fp = h.setup_collector()
    model, pool = _unique("m"), _unique("p")
    (a, _), (b, _) = post(h, key, *(record_body(fp, model=model, pool=pool) for _ in range(2)))
    value, forged_filter = _forgeries(other_fp, other_key.key_id)[column]
    if column == "received_at" and not h.db.is_postgres:
        value = "2000-01-01 00:00:00.000000"  # as SQLAlchemy writes times to SQLite
    superuser(
        h,
        ("records",),
        (f"UPDATE records SET {column} = :v WHERE request_id = :a", {"v": value, "a": a}),
    )
    c = h.client()
    for fields in ("full", "meta"):
        got = c.get(f"/v1/records/{a}")
        assert got.status_code == 200, got.text
        truthful(got.json())
        # the record is found by what its envelope says (or hidden), never by the forgery
        assert b in ids(search(c, model=model, fields=fields))
        assert b in ids(search(c, pool=pool, fields=fields))
        if forged_filter is not None:
            assert a not in ids(search(c, **forged_filter, fields=fields))
        else:
            assert ids(search(c, model=model, fields=fields)) == [a, b]


def test_a_records_row_pointed_at_another_entry_is_an_error_or_hidden(h: Harness):
    key, fp = h.setup_collector()
    model = _unique("m")
    (a, ia), (b, ib), (z, _) = post(h, key, *(record_body(fp, model=model) for _ in range(3)))
    # swap two rows' log indexes
    superuser(
        h,
        ("records",),
        ("UPDATE records SET log_index = -1 WHERE request_id = :a", {"a": a}),
        ("UPDATE records SET log_index = :i WHERE request_id = :b", {"i": ia, "b": b}),
        ("UPDATE records SET log_index = :i WHERE request_id = :a", {"i": ib, "a": a}),
    )
    c = h.client()
    for rid, other in ((a, b), (b, a)):
        err = assert_error(c.get(f"/v1/records/{rid}"), 500, "index_mismatch")
        assert "ledger audit" in err["message"] and other in err["message"]
    assert ids(search(c, model=model)) == [a, b, z]  # each from its own envelope
    # a row renamed: the new name is an error, the old one is gone, search still tells the truth
    renamed = _unique("req-renamed")
    superuser(
        h,
        ("records",),
        ("UPDATE records SET request_id = :n WHERE request_id = :z", {"n": renamed, "z": z}),
    )
    assert_error(c.get(f"/v1/records/{renamed}"), 500, "index_mismatch")
    assert_error(c.get(f"/v1/records/{z}"), 404, "record_not_found")
    assert ids(search(c, model=model, fields="meta")) == [a, b, z]
    # a row pointed at a leaf that is no record (the fingerprint's)
    fp_index = c.get(f"/v1/fingerprints/{fp}").json()["log_index"]
    superuser(
        h,
        ("records",),
        ("UPDATE records SET log_index = :i WHERE request_id = :n", {"i": fp_index, "n": renamed}),
    )
    assert_error(c.get(f"/v1/records/{renamed}"), 500, "index_mismatch")
    assert ids(search(c, model=model)) == [a, b]


def test_pages_stay_complete_and_in_order_when_rows_are_dropped(h: Harness, monkeypatch):
    key, fp = h.setup_collector()
    model = _unique("m")
    made = post(
        h, key, *(record_body(fp, model=model, tier=(2 if i % 3 == 0 else 1)) for i in range(10))
    )
    true_tier2 = [rid for rid, _ in made if TRUTH[rid]["tier"] == 2]
    lying = [rid for rid, _ in made if TRUTH[rid]["tier"] == 1][:5]
    superuser(
        h,
        ("records",),
        *((("UPDATE records SET tier = 2 WHERE request_id = :r", {"r": r})) for r in lying),
    )
    c = h.client()
    for limit in (1, 2, 3, 100):
        assert ids(search(c, model=model, tier=2, limit=limit, fields="meta")) == true_tier2
    page = c.get("/v1/records", params={"model": model, "tier": 2, "limit": 2}).json()
    assert page["count"] == 2 and page["next_cursor"]  # dropped rows' places are filled
    monkeypatch.setattr(queries, "MAX_DROPPED", 0)  # the server runs in this process
    first = c.get("/v1/records", params={"model": model, "tier": 2, "limit": 3}).json()
    assert first["count"] < 3 and first["next_cursor"]  # a short page, and the scan goes on
    assert ids(search(c, model=model, tier=2, limit=3)) == true_tier2


# --- cache -----------------------------------------------------------------------------------


def _completions_key(body: dict[str, Any]) -> str:
    return cache_key(COMPLETIONS, body["request"], body["fingerprint_id"])


def _hit(c: httpx.Client, key: str) -> dict[str, Any]:
    resp = c.get(f"/v1/cache/{key}")
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    assert data["key"] == key
    truthful(data)
    return data


def test_aborted_sampled_and_tier_0_records_are_never_hits(h: Harness):
    key, fp = h.setup_collector()
    c = h.client()
    cases = {
        "aborted": record_body(fp, seed=1, text_prompt=True, request_extra=GREEDY),
        "non-deterministic sampling": record_body(fp, seed=2, text_prompt=True),
        "tier 0": record_body(fp, seed=3, text_prompt=True, tier=0, request_extra=GREEDY),
    }
    cases["aborted"]["aborted"] = True
    post(h, key, *cases.values())
    for reason, body in cases.items():
        err = assert_error(c.get(f"/v1/cache/{_completions_key(body)}"), 404, "cache_miss")
        assert reason in err["message"] and err["details"]["records"] == 1
    # the same request later, complete, deterministic, tier 1: that one is the answer
    later = record_body(fp, seed=1, text_prompt=True, request_extra=GREEDY)
    [(rid, _)] = post(h, key, later)
    assert _hit(c, _completions_key(later))["request_id"] == rid
    # several reusable records under one key: the earliest in log order, every time
    twins = [record_body(fp, seed=4, request_extra={"seed": 9}) for _ in range(3)]
    made = post(h, key, *twins)
    for _ in range(2):
        assert _hit(c, _completions_key(twins[0]))["request_id"] == made[0][0]


def _cache_rows(h: Harness, request_id: str) -> list[dict[str, Any]]:
    with h.db.read() as s:
        return [
            dict(r._mapping)
            for r in s.execute(
                text("SELECT * FROM cache_keys WHERE request_id = :r ORDER BY cache_key"),
                {"r": request_id},
            )
        ]


def test_a_cache_row_pointed_at_another_record_is_an_error_never_an_answer(h: Harness):
    key, fp = h.setup_collector()
    c = h.client()
    bodies = [record_body(fp, seed=s, text_prompt=True, request_extra=GREEDY) for s in (10, 11)]
    sampled = record_body(fp, seed=12, text_prompt=True)
    tier0 = record_body(fp, seed=13, text_prompt=True, tier=0, request_extra=GREEDY)
    (a, ia), (b, ib), (n, _), (z, _) = post(h, key, *bodies, sampled, tier0)
    ka, kb = _completions_key(bodies[0]), _completions_key(bodies[1])
    assert _hit(c, ka)["request_id"] == a
    fp_index = c.get(f"/v1/fingerprints/{fp}").json()["log_index"]
    unknown = "ck1:sha256:" + uuid.uuid4().hex * 2
    set_row = "UPDATE cache_keys SET {} WHERE cache_key = :k AND request_id = :r"
    edits = {
        "pointed at b": ("request_id = :b, log_index = :ib", {"k": ka, "r": a, "b": b, "ib": ib}),
        "index of b": ("log_index = :ib", {"k": ka, "r": a, "ib": ib}),
        "name of b": ("request_id = :b", {"k": ka, "r": a, "b": b}),
        "a fingerprint's leaf": ("log_index = :i", {"k": ka, "r": a, "i": fp_index}),
        "a missing leaf": ("log_index = :i", {"k": ka, "r": a, "i": 10**9}),
    }
    for what, (assignment, params) in edits.items():
        superuser(h, ("cache_keys",), (set_row.format(assignment), params))
        err = assert_error(c.get(f"/v1/cache/{ka}"), 500, "index_mismatch")
        assert "ledger audit" in err["message"], what
        # put the row back as ingest wrote it
        back = {"rid": a, "idx": ia, "k": ka, "r": params.get("b", a)}
        superuser(
            h,
            ("cache_keys",),
            (
                "UPDATE cache_keys SET request_id = :rid, log_index = :idx "
                "WHERE cache_key = :k AND request_id = :r",
                back,
            ),
        )
        assert _hit(c, ka)["request_id"] == a
    # a row added under a key the record does not have, and under another record's key
    row = _cache_rows(h, a)[0]
    for new_key in (unknown, kb):
        superuser(
            h,
            ("cache_keys",),
            (
                "INSERT INTO cache_keys (cache_key, request_id, log_index, tier, deterministic) "
                "VALUES (:k, :r, :i, :t, :d)",
                {"k": new_key, "r": a, "i": ia, "t": row["tier"], "d": row["deterministic"]},
            ),
        )
        assert_error(c.get(f"/v1/cache/{new_key}"), 500, "index_mismatch")
        superuser(
            h,
            ("cache_keys",),
            (
                "DELETE FROM cache_keys WHERE cache_key = :k AND request_id = :r",
                {"k": new_key, "r": a},
            ),
        )
    assert _hit(c, kb)["request_id"] == b
    # a sampled record marked deterministic, a tier-0 record marked tier 1, a good one marked
    # tier 0: the columns disagree with the envelopes, so never an answer
    for rid, column, value in ((n, "deterministic", True), (z, "tier", 1), (b, "tier", 0)):
        superuser(
            h,
            ("cache_keys",),
            (f"UPDATE cache_keys SET {column} = :v WHERE request_id = :r", {"r": rid, "v": value}),
        )
    for body in (sampled, tier0, bodies[1]):
        assert_error(c.get(f"/v1/cache/{_completions_key(body)}"), 500, "index_mismatch")
    # a deleted row hides the record, nothing more
    superuser(h, ("cache_keys",), ("DELETE FROM cache_keys WHERE request_id = :r", {"r": a}))
    assert_error(c.get(f"/v1/cache/{ka}"), 404, "cache_miss")


def _chat_fingerprint(h: Harness, key: SigningKey) -> tuple[str, int]:
    body = {
        "schema_version": 1,
        "model": {"name": _unique("chat"), "chat_template": {"digest": "sha256:" + "ab" * 32}},
        "engine": {"name": "test"},
    }
    resp = h.client().post(
        "/v1/fingerprints", content=sign_envelope(FINGERPRINT_KIND, body, key).canonical
    )
    assert resp.status_code == 201, resp.text
    return resp.json()["fingerprint_id"], resp.json()["log_index"]


def test_a_fingerprint_row_pointed_at_another_fingerprint_is_an_error(h: Harness):
    key = h.collector()
    (fp, fp_index), (other, other_index) = _chat_fingerprint(h, key), _chat_fingerprint(h, key)
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    body = build_record_body(
        request_id=_unique("req-chat"),
        fingerprint_id=fp,
        worker_id="w1",
        pool="p1",
        tier=1,
        endpoint=CHAT,
        model="m",
        request=request,
        prompt_token_ids=[1, 2, 3],
        choices=[Choice([4, 5], [-0.5, -0.25], None, None, finish_reason="stop")],
        started_at="2026-11-29T09:00:00Z",
        ttft_ns=1,
        total_ns=2,
        system_fingerprint=None,
    )
    [(rid, _)] = post(h, key, body)
    c = h.client()
    asked = {"endpoint": CHAT, "request": request, "fingerprint_id": fp}
    chat_key = c.post("/v1/cache/key", json=asked).json()["key"]
    assert chat_key == cache_key(CHAT, request, fp, chat_template="sha256:" + "ab" * 32)
    assert _hit(c, chat_key)["request_id"] == rid
    superuser(
        h,
        ("fingerprints",),
        ("UPDATE fingerprints SET log_index = -5 WHERE fingerprint_id = :o", {"o": other}),
        (
            "UPDATE fingerprints SET log_index = :i WHERE fingerprint_id = :f",
            {"i": other_index, "f": fp},
        ),
        (
            "UPDATE fingerprints SET log_index = :i WHERE fingerprint_id = :o",
            {"i": fp_index, "o": other},
        ),
    )
    assert_error(c.post("/v1/cache/key", json=asked), 500, "index_mismatch")
    assert_error(c.get(f"/v1/cache/{chat_key}"), 500, "index_mismatch")


# --- parameters ------------------------------------------------------------------------------

BAD_TIMES = [
    "0001-01-01T00:00:00+00:01",  # before year 1 once in UTC
    "9999-12-31T23:59:59-00:01",  # after year 9999 once in UTC
    "2020-01-01T00:00:00",  # no zone
    "2020-01-01",
    "2020-13-01T00:00:00Z",
    "2020-01-01T00:00:00+25:00",
    "2020-01-01T00:00:00+00:60",  # no minute 60 in an offset (datetime reads +01:00)
    "2020-01-01T00:00:00-01:99",
    "yesterday",
    "",
    "0",
    "1700000000",
    "\uff12\uff10\uff12\uff10-01-01T00:00:00Z",  # full-width digits
    "2020-01-01T00:00:00Z" + "0" * 100,
    "20200101T000000Z",  # ISO 8601 basic format, not RFC 3339
    "2020-01-01T00:00Z",
    "2020-01-01T23:59:60Z",
    "9999-12-31T23:59:59.9999999Z",  # rounded up to the next microsecond: past year 9999
]


@pytest.mark.parametrize("name", ["since", "until"])
def test_every_malformed_time_is_a_422(h: Harness, name: str):
    c = h.client()
    for value in BAD_TIMES:
        assert_error(c.get("/v1/records", params={name: value}), 422, "invalid_time_range")
    assert_error(
        c.get(
            "/v1/records", params={"since": "2020-01-02T00:00:00Z", "until": "2020-01-01T00:00:00Z"}
        ),
        422,
        "invalid_time_range",
    )
    for value in (
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59.999999Z",
        "2020-01-01T05:00:00+05:00",
        "2020-01-01t00:00:00.123456789-05:30",
    ):
        assert c.get("/v1/records", params={name: value, "limit": 1}).status_code == 200


def test_every_other_malformed_search_parameter_is_a_422(h: Harness):
    c = h.client()
    cases: list[tuple[dict[str, Any], str]] = [
        *(({"limit": v}, "schema_violation") for v in (0, -1, 1001, 10**30, "x", 1.5, "")),
        *(({"tier": v}, "schema_violation") for v in (-1, 3, "x", 1.5, 10**30)),
        ({"fields": "all"}, "schema_violation"),
        *(({"cursor": v}, "invalid_cursor") for v in ("garbage", "", "A" * 5000, "djE6LTE")),
        *(({"model": v}, "invalid_parameters") for v in ("\x00", "a\x00b", "m" * 301, "")),
        *(({"pool": v}, "invalid_parameters") for v in ("a b", "\x00", "p" * 101, "")),
        *(
            ({"fingerprint_id": v}, "invalid_parameters")
            for v in ("x", "sha256:" + "G" * 64, "\x00")
        ),
    ]
    for params, code in cases:
        assert_error(c.get("/v1/records", params=params), 422, code)


def test_malformed_request_ids_and_cache_keys_are_422(h: Harness):
    _, fp = h.setup_collector()
    c = h.client()
    for bad in ("%00", "a%20b", "r" * 201, "%E2%98%83"):
        assert_error(c.get(f"/v1/records/{bad}"), 422, "invalid_parameters")
        assert_error(c.get(f"/v1/records/{bad}/evidence"), 422, "invalid_parameters")
    for bad in (
        "garbage",
        "%00",
        "ck1:sha256:" + "G" * 64,
        "ck1:sha256:" + "a" * 63,
        "ck1:sha256:" + "a" * 65,
    ):
        assert_error(c.get(f"/v1/cache/{bad}"), 422, "invalid_parameters")
    for bad_fp in ("\x00", "sha256:" + "A" * 64, "x" * 5000):
        asked = {"endpoint": COMPLETIONS, "request": {"prompt": "hi"}, "fingerprint_id": bad_fp}
        assert_error(c.post("/v1/cache/key", json=asked), 422, "invalid_parameters")
    asked = {"endpoint": COMPLETIONS, "request": {"prompt": "hi"}, "fingerprint_id": fp}
    assert c.post("/v1/cache/key", json=asked).status_code == 200


# --- the cache:read scope --------------------------------------------------------------------


def test_cache_read_looks_up_keys_and_hits_but_reads_no_records(h: Harness):
    key, fp = h.setup_collector()
    body = record_body(fp, seed=21, text_prompt=True, request_extra=GREEDY)
    [(rid, idx)] = post(h, key, body)
    created = json.loads(
        ledger(
            "tokens",
            "create",
            "--scope",
            "cache:read",
            "--name",
            "cache",
            "--db",
            h.db.url,
            "--json",
        ).stdout
    )
    assert created["scopes"] == ["cache:read"]
    asked = {"endpoint": COMPLETIONS, "request": body["request"], "fingerprint_id": fp}
    allowed = {
        "cache:read": created["token"],
        "records:read": h.token("records:read"),
        "admin": "admin",
    }
    for scope, token in allowed.items():
        reader = h.client(token)
        resp = reader.post("/v1/cache/key", json=asked)
        assert resp.status_code == 200, (scope, resp.text)
        assert _hit(reader, resp.json()["key"])["request_id"] == rid
    for scope in ("records:write", "replay"):
        other = h.client(h.token(scope))
        assert_error(other.post("/v1/cache/key", json=asked), 403, "insufficient_scope")
        assert_error(other.get(f"/v1/cache/{_completions_key(body)}"), 403, "insufficient_scope")
    cache_only = h.client(created["token"])
    for path in (
        "/v1/records",
        f"/v1/records?model={body['model']}",
        f"/v1/records/{rid}",
        f"/v1/records/{rid}/evidence",
        f"/v1/fingerprints/{fp}",
        "/v1/keys",
        f"/v1/keys/{key.key_id}",
        "/v1/log/checkpoint",
        f"/v1/log/proof/inclusion?index={idx}&tree_size={idx + 1}",
        "/v1/workers",
        "/v1/pools",
        "/v1/replays/rp-x",
        "/v1/certificates/c-x",
    ):
        err = assert_error(cache_only.get(path), 403, "insufficient_scope")
        assert err["details"]["required"] == "records:read", path
    assert_error(cache_only.post("/v1/records", json={"envelopes": []}), 403, "insufficient_scope")
    assert_error(
        cache_only.post("/v1/replays", json={"request_id": rid}), 403, "insufficient_scope"
    )


def test_a_time_finer_than_microseconds_bounds_a_search_exactly() -> None:
    """Stored times have microseconds: a bound 100 ns after a record's time is rounded up, so
    ``since`` leaves the record out and ``until`` keeps it (truncating did the opposite)."""
    from datetime import UTC, datetime

    from ledger.storage.queries import parse_time

    at = datetime(2026, 12, 5, 11, 0, 22, 317917, tzinfo=UTC)
    assert parse_time("2026-12-05T11:00:22.3179171Z", "since") == at.replace(microsecond=317918)
    assert parse_time("2026-12-05T11:00:22.3179170Z", "since") == at  # zeros: the same time
    assert parse_time("2026-12-05T11:00:22.317917Z", "since") == at
