"""Search by worker, aborted, replay verdict, content state and legal hold, newest first, on
SQLite and Postgres, over HTTP; and every new filter answers from the log, not from an index
row a database superuser edited."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ledger.record_v2 import commit_record
from ledger.records import RECORD_KIND
from ledger.signing import SigningKey, sign_envelope
from ledger.storage import verdicts
from tests.api.test_read_paths import superuser
from tests.conftest import BACKENDS, fresh_url
from tests.support.documents import record_body, verdict_body
from tests.support.harness import Harness, start_harness


@dataclass
class Scene:
    h: Harness
    ids: dict[str, str]  # name -> request ID
    order: list[str]  # request IDs in log order


def _post(h: Harness, key: SigningKey, fp: str, model: str, **edits: Any) -> tuple[str, int]:
    body = record_body(fp, model=model, text_prompt=True)
    body.update(edits)
    committed, disclosures = commit_record(body)
    env = sign_envelope(RECORD_KIND, committed, key)
    resp = h.client().post(
        "/v1/records", json={"records": [{"envelope": env.to_dict(), "disclosures": disclosures}]}
    )
    assert resp.status_code == 201, resp.text
    return env.body["request_id"], resp.json()["results"][0]["log_index"]


def _verdict(h: Harness, rid: str, index: int, verdict: str) -> None:
    body = h.client().get(f"/v1/records/{rid}").json()["envelope"]["body"]
    verdicts.append_verdict(h.db, h.log_key, verdict_body(body, index, verdict))


@pytest.fixture(scope="module", params=BACKENDS)
def scene(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scene]:
    backend = request.param
    h = start_harness(backend, fresh_url(request, backend), tmp_path_factory.mktemp(backend))
    key, fp = h.setup_collector()
    model = f"m-{uuid.uuid4().hex[:8]}"
    ids: dict[str, str] = {}
    order = []
    plan: list[tuple[str, dict[str, Any]]] = [
        ("plain", {}),
        ("other_worker", {"worker_id": "w2"}),
        ("aborted", {"aborted": True}),
        ("erased", {}),
        ("held", {}),
        ("bitwise", {}),
        ("diverged", {}),
    ]
    index = {}
    for name, edits in plan:
        ids[name], index[name] = _post(h, key, fp, model, **edits)
        order.append(ids[name])
    c = h.client()
    assert c.post(f"/v1/records/{ids['erased']}/erasure", json={"reason": "t"}).status_code == 201
    assert c.post("/v1/holds", json={"request_id": ids["held"], "reason": "t"}).status_code == 201
    _verdict(h, ids["bitwise"], index["bitwise"], "bitwise")
    _verdict(h, ids["diverged"], index["diverged"], "diverged")
    yield Scene(h, {**ids, "model": model}, order)
    h.close()


def _search(c: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    """Every item, following cursors."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        more = {"cursor": cursor} if cursor else {}
        resp = c.get("/v1/records", params={**params, "fields": "meta", **more})
        assert resp.status_code == 200, resp.text
        page = resp.json()
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items


def _ids(items: list[dict[str, Any]]) -> list[str]:
    return [i["request_id"] for i in items]


def test_each_filter_keeps_exactly_its_records(scene: Scene):
    c, ids, model = scene.h.client(), scene.ids, scene.ids["model"]
    assert _ids(_search(c, model=model)) == scene.order
    assert _ids(_search(c, model=model, worker_id="w2")) == [ids["other_worker"]]
    assert _ids(_search(c, model=model, aborted="true")) == [ids["aborted"]]
    assert ids["aborted"] not in _ids(_search(c, model=model, aborted="false"))
    assert _ids(_search(c, model=model, verdict="bitwise")) == [ids["bitwise"]]
    assert _ids(_search(c, model=model, verdict="diverged")) == [ids["diverged"]]
    never = _ids(_search(c, model=model, verdict="none"))
    assert never == [r for r in scene.order if r not in (ids["bitwise"], ids["diverged"])]
    assert _ids(_search(c, model=model, content="erased")) == [ids["erased"]]
    assert ids["erased"] not in _ids(_search(c, model=model, content="complete"))
    assert _ids(_search(c, model=model, content="in_log")) == []  # every record here is v2
    assert _ids(_search(c, model=model, held="true")) == [ids["held"]]
    assert ids["held"] not in _ids(_search(c, model=model, held="false"))
    both = _search(c, model=model, verdict="bitwise", held="false", aborted="false")
    assert _ids(both) == [ids["bitwise"]]


def test_items_carry_the_latest_verdict_and_the_hold(scene: Scene):
    items = {i["request_id"]: i for i in _search(scene.h.client(), model=scene.ids["model"])}
    assert items[scene.ids["bitwise"]]["verdict"] == "bitwise"
    assert items[scene.ids["plain"]]["verdict"] is None
    assert items[scene.ids["held"]]["held_by"].startswith("hold-")
    assert items[scene.ids["plain"]]["held_by"] is None
    assert items[scene.ids["erased"]]["content"] == "erased"


def test_newest_first_walks_the_log_backwards_page_by_page(scene: Scene):
    c = scene.h.client()
    for limit in (1, 2, 100):
        got = _search(c, model=scene.ids["model"], order="newest", limit=limit)
        assert _ids(got) == scene.order[::-1]


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"verdict": "great"}, "invalid_parameters"),
        ({"worker_id": "w 1"}, "invalid_parameters"),
        ({"content": "gone"}, "schema_violation"),
        ({"aborted": "maybe"}, "schema_violation"),
        ({"order": "random"}, "schema_violation"),
    ],
)
def test_malformed_filters_are_refused(scene: Scene, params: dict[str, str], code: str):
    resp = scene.h.client().get("/v1/records", params=params)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["code"] == code


def test_edited_index_rows_cannot_make_a_search_lie(scene: Scene):
    """A superuser flips the diverged replay's index row to bitwise, and moves a record to
    another worker in the index: the search still answers what the log says (an edited index
    row can hide a record from a filter, which `ledger audit` reports, never misstate one)."""
    h, ids, model = scene.h, scene.ids, scene.ids["model"]
    superuser(
        h,
        ("replays", "records"),
        (
            "UPDATE replays SET verdict = 'bitwise' WHERE request_id = :r",
            {"r": ids["diverged"]},
        ),
        ("UPDATE records SET worker_id = 'w2' WHERE request_id = :r", {"r": ids["plain"]}),
    )
    c = h.client()
    assert _ids(_search(c, model=model, verdict="bitwise")) == [ids["bitwise"]]
    shown = {i["request_id"]: i for i in _search(c, model=model)}
    assert shown[ids["diverged"]]["verdict"] == "diverged"
    assert shown[ids["plain"]]["worker_id"] == "w1"
    assert _ids(_search(c, model=model, worker_id="w2")) == [ids["other_worker"]]
