"""The answers a process keeps (``HotAnswers``) stay within the memory it is given: each is
charged more than what it actually holds (measured with tracemalloc, in a process of its
own, for records of every shape), and the charges never add up to more than the budget."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

import migrations
from ledger.cache_answer import response
from ledger.cachekey import COMPLETIONS
from ledger.storage import ingest
from ledger.storage.cache import Found, find_reusable
from ledger.storage.cache_lookup import HotAnswers, _Kept, kept_bytes
from ledger.storage.cache_rows import read_rows
from ledger.storage.database import Database
from ledger.storage.models import CacheKey
from tests.support.documents import record_envelope, record_item_v2
from tests.support.seed import Seeded, seed_ledger

GREEDY = {"temperature": 0}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Database, Seeded]]:
    db = Database(f"sqlite:///{tmp_path_factory.mktemp('hot') / 'ledger.db'}")
    migrations.upgrade(db)
    try:
        yield db, seed_ledger(db)
    finally:
        db.dispose()


def _kept(db: Database, seeded: Seeded, v2: bool, **shape: Any) -> _Kept:
    """A record of ``shape`` ingested, and its answer as a lookup keeps it."""
    kw = {"tier": 1, "request_extra": GREEDY, **shape}
    if v2:
        item = record_item_v2(seeded.collector, seeded.fingerprint_id, **kw)
    else:
        envelope = record_envelope(seeded.collector, seeded.fingerprint_id, **kw).to_dict()
        item = ingest.RecordItem(envelope, ())
    ingest.ingest_records(db, [item])
    rid = item.envelope["body"]["request_id"]
    with db.read() as s:
        key = s.scalars(select(CacheKey.cache_key).where(CacheKey.request_id == rid)).first()
    assert key is not None
    rows = read_rows(db, key)
    with db.read() as s:
        found = find_reusable(s, key)
    assert found.hit is not None and found.hit.request_id == rid
    return _Kept(rows, found)


def _measured(db: Database, seeded: Seeded, v2: bool, **shape: Any) -> tuple[int, _Kept]:
    """What a kept answer holds once served (its typed record parsed, an answer built from
    it), as tracemalloc counts it: the memory still allocated while it is held."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = _kept(db, seeded, v2, **shape)
        assert kept.found.hit is not None
        record = kept.found.hit.record  # parsed on first use, then held
        assert record.request is not None
        served = response(COMPLETIONS, record.request, record)
        assert served["choices"]
        del served, record
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return held, kept


SHAPES = {
    "small": {"prompt_len": 12, "out_len": 8},
    "long prompt and output": {"prompt_len": 4000, "out_len": 4000},
    "top-20 logprobs": {"prompt_len": 50, "out_len": 1000, "top_k": 20},
    "text prompt": {"prompt_len": 3000, "out_len": 16, "text_prompt": True},
}


def _measure_all(path: Path) -> dict[str, tuple[int, int]]:
    """Per shape and schema: what a kept answer holds, and what it is charged."""
    db = Database(f"sqlite:///{path}")
    migrations.upgrade(db)
    seeded = seed_ledger(db)
    out = {}
    try:
        for shape, kw in SHAPES.items():
            for v2 in (False, True):
                _measured(db, seeded, v2, **kw)  # the first of a kind warms caches
                held, kept = _measured(db, seeded, v2, **kw)
                out[f"{shape}-{'v2' if v2 else 'v1'}"] = (held, kept_bytes(kept))
    finally:
        db.dispose()
    return out


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, int]]:
    """Measured in a process of its own: tracemalloc counts every thread's allocations, and
    a test session runs servers in threads beside the tests."""
    path = tmp_path_factory.mktemp("hot") / "measured.db"
    done = subprocess.run(
        [sys.executable, "-m", "tests.ledger.test_hot_answers", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return {k: (v[0], v[1]) for k, v in json.loads(done.stdout).items()}


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_a_kept_answer_is_charged_more_than_it_holds(
    measured: dict[str, tuple[int, int]], shape: str, v2: bool
) -> None:
    held, charged = measured[f"{shape}-{'v2' if v2 else 'v1'}"]
    assert held < charged, f"{shape}: holds {held} bytes, charged {charged}"
    assert charged < 3 * held + 32 * 1024, f"{shape}: charged {charged} for {held} held"


def _empty(rows: int) -> _Kept:
    """A kept miss with ``rows`` index rows (charged by its rows alone)."""
    row = (0, "req", 1, True)
    return _Kept(tuple(row for _ in range(rows)), Found(None, (), rows, frozenset()))


def _total(hot: HotAnswers) -> int:
    return sum(kept_bytes(kept) for kept, _ in hot._items.values())


def test_answers_are_kept_within_the_bytes_given() -> None:
    one = kept_bytes(_empty(1))
    hot = HotAnswers(max_bytes=10 * one)
    for i in range(100):
        hot.put(f"k{i}", _empty(1), hot.generation)
        assert hot.bytes == _total(hot) <= 10 * one
    assert len(hot) == 10
    # the least recently used go first: k90 read, then one more put evicts k91
    assert hot.get("k90") is not None
    hot.put("k100", _empty(1), hot.generation)
    assert hot.get("k90") is not None and hot.get("k91") is None
    # a key kept again is charged once, at its new size
    hot.put("k100", _empty(3), hot.generation)
    assert hot.bytes == _total(hot) <= 10 * one
    assert sum(1 for key in hot._items if key == "k100") == 1
    # an answer charged more than the whole budget is not kept (and evicts nothing)
    kept_before = set(hot._items)
    hot.put("huge", _empty(10_000), hot.generation)
    assert hot.get("huge") is None and set(hot._items) == kept_before
    # dropping and clearing give back what they held
    hot.drop("k92")
    assert hot.bytes == _total(hot)
    hot.clear()
    assert hot.bytes == 0 and len(hot) == 0


def test_a_budget_of_zero_keeps_nothing() -> None:
    hot = HotAnswers(max_bytes=0)
    hot.put("k", _empty(1), hot.generation)
    assert hot.get("k") is None and hot.bytes == 0


def test_forgetting_erased_records_gives_back_their_bytes(
    ledger: tuple[Database, Seeded],
) -> None:
    db, seeded = ledger
    kept = [_kept(db, seeded, True, prompt_len=100, out_len=100) for _ in range(3)]
    hot = HotAnswers()
    for i, k in enumerate(kept):
        hot.put(f"k{i}", k, hot.generation)
    assert hot.bytes == _total(hot) == sum(map(kept_bytes, kept))
    erased = kept[1].found.hit
    assert erased is not None
    hot.forget({erased.request_id})
    assert hot.get("k1") is None
    assert hot.bytes == _total(hot) == kept_bytes(kept[0]) + kept_bytes(kept[2])


def test_every_change_is_reported_as_it_leaves_the_answers(
    ledger: tuple[Database, Seeded],
) -> None:
    """``on_change`` (the API's gauges of how full the kept answers are) is told the bytes
    charged and the answers kept after every change: puts, evictions, a key kept again, one
    too large for the budget replacing a kept one, drops, forgets and clears."""
    import random

    db, seeded = ledger
    hits = [_kept(db, seeded, False) for _ in range(3)]
    told: list[tuple[int, int]] = []
    one = kept_bytes(_empty(1))
    hot = HotAnswers(max_bytes=12 * one, on_change=lambda *now: told.append(now))
    rng = random.Random(5)
    for step in range(400):
        key = f"k{rng.randrange(20)}"
        action = rng.choice(["put", "put", "put", "huge", "drop", "forget", "clear", "get"])
        before = len(told)
        if action == "put":
            hot.put(key, rng.choice([_empty(rng.randrange(1, 4)), *hits]), hot.generation)
        elif action == "huge":
            hot.put(key, _empty(10_000), hot.generation)
        elif action == "drop":
            hot.drop(key)
        elif action == "forget":
            hit = rng.choice(hits).found.hit
            assert hit is not None
            hot.forget({hit.request_id})
        elif action == "clear" and rng.random() < 0.1:
            hot.clear()
        else:
            hot.get(key)
        if len(told) > before:
            assert told[-1] == (hot.bytes, len(hot)), (step, action)
        assert told == [] or told[-1] == (hot.bytes, len(hot)), (step, action)
    assert len(told) > 100


def test_a_failing_report_fails_no_lookup_or_erasure() -> None:
    """The report is told at the start, and a report that raises (a gauge that cannot be
    written) is logged: the answer is kept, the drop and the clear done."""
    told: list[tuple[int, int]] = []

    def report(size: int, answers: int) -> None:
        told.append((size, answers))
        raise OSError("the gauge file is gone")

    hot = HotAnswers(max_bytes=10 * kept_bytes(_empty(1)), on_change=report)
    assert told == [(0, 0)]
    hot.put("k", _empty(1), hot.generation)
    assert hot.get("k") is not None and told[-1] == (hot.bytes, 1)
    hot.drop("k")
    hot.clear()
    assert len(hot) == 0 and told[-1] == (0, 0)


if __name__ == "__main__":
    print(json.dumps(_measure_all(Path(sys.argv[1]))))
