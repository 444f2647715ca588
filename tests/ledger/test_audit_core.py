"""The audit core without a database: derivations equal the write path's, time bounds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.audit import derive, registry
from ledger.audit.rows import LeafChunk, as_time, micros
from ledger.audit.times import SECOND, TimeBounds, TimeRules
from ledger.cachekey import is_deterministic, keys_of_record
from ledger.inference_record import parse_record
from ledger.records import RECORD_KIND
from ledger.signing import SigningKey, sign_envelope
from ledger.storage import cache, keystore, verdicts
from tests.support.audited_ledger import TEMPLATE, chat_body
from tests.support.documents import record_body

FP = "sha256:" + "a" * 64
KEY = SigningKey.generate()


def test_kind_names_are_the_storage_layers():
    assert registry.REGISTRATION_KIND == keystore.REGISTRATION_KIND
    assert registry.REVOCATION_KIND == keystore.REVOCATION_KIND
    assert registry.LOG_ROLE == keystore.LOG_ROLE
    assert derive.CERTIFICATE_KIND == verdicts.CERTIFICATE_KIND


def _ingested_rows(body: dict[str, Any], template: str | None) -> list[tuple[Any, ...]]:
    """The cache_keys rows ingest writes for a record (ledger.storage.cache)."""
    keyed = cache.Keyed(
        body["request_id"],
        keys_of_record(parse_record(body), template),
        body["tier"],
        is_deterministic(body["request"]),
    )
    return sorted((k, keyed.request_id, 7, keyed.tier, keyed.deterministic) for k in keyed.keys)


@given(
    text=st.booleans(),
    tier=st.integers(0, 2),
    temperature=st.sampled_from([0, 0.0, 0.7, 1]),
    seed=st.one_of(st.none(), st.integers(0, 2**31)),
    extra=st.dictionaries(st.sampled_from(["top_p", "stop", "n", "stream", "user"]), st.just(1)),
)
def test_cache_key_rows_are_those_ingest_writes(text, tier, temperature, seed, extra):
    request = {"temperature": temperature, **({"seed": seed} if seed is not None else {})}
    if "stop" in extra:
        extra["stop"] = ["\n"]
    body = record_body(FP, tier=tier, text_prompt=text, request_extra={**request, **extra}, seed=3)
    env = sign_envelope(RECORD_KIND, body, KEY)
    derived = sorted(tuple(r) for r in derive.cache_key_rows(parse_record(env.body), 7, None))
    assert derived == _ingested_rows(body, None)
    assert len(derived) == (2 if text else 1)


@pytest.mark.parametrize("template", [TEMPLATE, None])
def test_chat_cache_keys_depend_on_the_template_as_ingest_does(template):
    body = chat_body(FP, "req-chat")
    env = sign_envelope(RECORD_KIND, body, KEY)
    assert sorted(
        tuple(r) for r in derive.cache_key_rows(parse_record(env.body), 7, template)
    ) == _ingested_rows(body, template)


def test_chat_template_digest_is_read_as_ingest_reads_it():
    bodies = [
        {"model": {"chat_template": {"digest": TEMPLATE}}},
        {"model": {"chat_template": {}}},
        {"model": {}},
        {"model": {"chat_template": {"digest": 5}}},
    ]
    for body in bodies:
        assert derive.chat_template(body) == cache.chat_template_digest(body)
    assert derive.chat_template({"model": "not an object"}) is None


def test_a_record_row_is_the_summary_ingest_indexes():
    body = record_body(FP, tier=2, pool="p7", model="m")
    env = sign_envelope(RECORD_KIND, body, KEY)
    row = derive.record_row(env, 12, 99)
    assert row == (
        body["request_id"], 12, env.body_digest, FP, KEY.key_id, "m", 2, "p7", "w1",
        "/v1/completions", 99,
    )  # fmt: skip


# -- time bounds -----------------------------------------------------------------------------

T0 = micros(datetime(2026, 12, 1, 9, 0, tzinfo=UTC))


def chunk(times: list[int | None], start: int = 0) -> LeafChunk:
    n = len(times)
    return LeafChunk(list(range(start, start + n)), [b""] * n, [b""] * n, times)


def bounds(checkpoints: list[tuple[int, int]], covered: int, tolerance: int = 0, now: int = 0):
    return TimeBounds(checkpoints, covered, TimeRules(now or T0 + 3600 * SECOND, tolerance, 0))


def test_times_between_the_checkpoints_around_them_pass():
    # leaves 0-2 before checkpoint 3 (T0+10s), 3-4 before checkpoint 5 (T0+20s)
    b = bounds([(3, T0 + 10 * SECOND), (5, T0 + 20 * SECOND)], 5)
    times = [T0, T0 + 5 * SECOND, T0 + 10 * SECOND, T0 + 10 * SECOND, T0 + 19 * SECOND]
    assert b.check(chunk(times)) == []
    assert b.coverage() == []


def test_a_time_after_its_covering_checkpoint_or_before_the_last_uncovering_one_fails():
    b = bounds([(3, T0 + 10 * SECOND), (5, T0 + 20 * SECOND)], 5)
    times = [T0, T0 + 11 * SECOND, T0, T0 + 9 * SECOND, T0 + 20 * SECOND]
    found = b.check(chunk(times))
    assert [(f.check, f.index, f.table, f.column) for f in found] == [
        ("time", 1, "log_entries", "appended_at"),
        ("time", 3, "log_entries", "appended_at"),
    ]
    assert "after the checkpoint of size 3" in found[0].message
    assert "before the checkpoint of size 3" in found[1].message


def test_the_tolerance_allows_for_clock_differences():
    b = bounds([(1, T0)], 1, tolerance=2 * SECOND)
    assert b.check(chunk([T0 + 2 * SECOND])) == []
    assert len(b.check(chunk([T0 + 2 * SECOND + 1]))) == 1


def test_uncovered_leaves_fail_once_the_interval_has_passed():
    now = T0 + 100 * SECOND
    b = TimeBounds([(2, T0 + SECOND)], 2, TimeRules(now, SECOND, 10 * SECOND))
    times = [T0, T0 + SECOND, T0 + 2 * SECOND, T0 + 50 * SECOND, now - 5 * SECOND]
    assert b.check(chunk(times)) == []
    (finding,) = b.coverage()
    assert (finding.check, finding.index, finding.table) == ("coverage", 2, "checkpoints")
    assert finding.message.startswith("leaves 2..3 are covered by no checkpoint")


def test_an_uncovered_leaf_from_the_future_fails():
    b = TimeBounds([], 0, TimeRules(T0, SECOND, SECOND))
    (finding,) = b.check(chunk([T0 + 2 * SECOND]))
    assert finding.check == "time" and "after the audit began" in finding.message


def test_a_time_that_is_no_time_is_named():
    b = bounds([(2, T0)], 2)
    (finding,) = b.check(chunk([T0, None]))
    assert (finding.index, finding.column) == (1, "appended_at")


@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=60),
    st.lists(st.integers(1, 60), max_size=6),
    st.integers(1, 7),
)
def test_chunked_checks_equal_one_pass(offsets, sizes, cut):
    """Findings do not depend on where the scan's chunks end."""
    times = [T0 + o for o in offsets]
    cps = [(s, T0 + 500_000) for s in sorted(set(sizes))]
    covered = max((s for s, _ in cps), default=0)
    whole = bounds(cps, covered)
    expected = whole.check(chunk(times))
    parts = bounds(cps, covered)
    got = []
    for start in range(0, len(times), cut):
        got += parts.check(chunk(times[start : start + cut], start))
    assert got == expected
    assert parts.coverage() == whole.coverage()


def test_times_print_as_rfc3339():
    assert as_time(T0) == "2026-12-01T09:00:00Z"
    assert as_time(None) == "(not a time)"


def test_a_time_that_is_no_time_is_named_without_timed_checkpoints():
    b = bounds([], 2)  # covered by checkpoints without a time
    (finding,) = b.check(chunk([T0, None]))
    assert (finding.index, finding.column) == (1, "appended_at")
