"""Replaying a record cut mid-answer (``aborted``: the client or the engine left), through the
API on SQLite and Postgres, with a real HTTP worker answering the order.

The record holds only the start of the output the engine was making; a replay runs the whole
request. Its verdict compares that start alone: an engine that reproduces it bit for bit is
``bitwise`` (with a reason saying what was compared), never ``diverged`` for the tokens the
record never had; a token or logprob that differs inside it still counts. A record cut before
its first token is ``not_comparable``: there is nothing to reproduce.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from ledger.packing import pack_float32, pack_int32, unpack_float32, unpack_int32
from ledger.records import RECORD_KIND
from ledger.signing import SigningKey, sign_envelope
from tests.support.documents import record_body
from tests.support.harness import Harness
from tests.support.workers import (
    FakeWorker,
    heartbeat,
    post_heartbeat,
    register_fingerprint,
    serial_engine,
)

CUT = "the record was cut mid-answer (aborted): only its recorded tokens are compared"


def _cut(body: dict[str, Any], keep: list[int]) -> dict[str, Any]:
    """``body`` as the collector records it when the answer stops after ``keep[i]`` tokens of
    choice ``i`` (a fresh request ID)."""
    cut = copy.deepcopy(body)
    cut["request_id"] = f"req-cut-{uuid.uuid4().hex[:8]}"
    cut["aborted"] = True
    for choice, n in zip(cut["choices"], keep, strict=True):
        choice["token_ids"] = pack_int32(unpack_int32(choice["token_ids"])[:n])
        choice["logprobs"] = pack_float32(unpack_float32(choice["logprobs"])[:n])
        choice["finish_reason"] = None
    cut["usage"]["completion_tokens"] = sum(keep)
    return cut


def _replay(
    api: Harness,
    fakes: list[FakeWorker],
    key: SigningKey,
    fp: str,
    recorded: dict[str, Any],
    replayed: dict[str, Any],
    tamper: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Log ``recorded``, have a worker answer its replay with ``replayed``'s output, and
    return the verdict's body."""
    response = api.client().post(
        "/v1/records", json={"envelopes": [sign_envelope(RECORD_KIND, recorded, key).to_dict()]}
    )
    assert response.status_code == 201, response.text
    fake = FakeWorker(key, replayed, tamper=tamper).start()
    fakes.append(fake)
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    beat = heartbeat(key, worker_id=f"w-{pool}", pool=pool, url=fake.url, fingerprint_id=fp)
    assert post_heartbeat(api, beat).status_code == 200
    answer = api.client(api.token("replay")).post(
        "/v1/replays", json={"request_id": recorded["request_id"], "pool": pool}
    )
    assert answer.status_code == 201, answer.text
    verdict: dict[str, Any] = answer.json()["envelope"]["body"]
    return verdict


@pytest.fixture
def whole(api: Harness) -> tuple[SigningKey, str, dict[str, Any]]:
    key = api.collector()
    fp = register_fingerprint(api, key, serial_engine())
    return key, fp, record_body(fp, out_len=8, request_extra={"temperature": 0, "stream": True})


def test_a_cut_record_reproduced_is_bitwise_over_what_it_recorded(
    api: Harness, fakes: list[FakeWorker], whole: tuple[SigningKey, str, dict[str, Any]]
) -> None:
    key, fp, body = whole
    verdict = _replay(api, fakes, key, fp, _cut(body, [4]), body)
    assert verdict["verdict"] == "bitwise"
    assert verdict["reason"] == CUT
    (choice,) = verdict["comparison"]["choices"]
    assert (choice["recorded_tokens"], choice["replayed_tokens"]) == (4, 8)
    assert choice["first_divergence"] is None and choice["tokens_equal"]
    assert (choice["logprobs_compared"], choice["logprobs_differing"]) == (4, 0)


def test_a_record_cut_before_any_token_is_not_comparable(
    api: Harness, fakes: list[FakeWorker], whole: tuple[SigningKey, str, dict[str, Any]]
) -> None:
    """Nothing recorded, nothing reproduced: never ``bitwise`` (a search by verdict, and
    ``ledger replay``'s exit status, would count it reproduced)."""
    key, fp, body = whole
    verdict = _replay(api, fakes, key, fp, _cut(body, [0]), body)
    assert verdict["verdict"] == "not_comparable"
    assert verdict["reason"] == (
        "the record was cut before its first output token (aborted): nothing to compare"
    )
    assert verdict["comparison"]["choices"][0]["logprobs_compared"] == 0


@pytest.mark.parametrize(
    ("edit", "verdict", "first"),
    [
        # a token the record holds differs: diverged where it differs
        (lambda out: _set_token(out, 2), "diverged", 2),
        # a logprob the record holds differs: drift
        (lambda out: _set_logprob(out, 3), "tokens_match_logprobs_drift", None),
        # the replay stops before the recorded tokens end: diverged where it stops
        (lambda out: _shorten(out, 3), "diverged", 3),
    ],
)
def test_what_a_cut_record_holds_is_still_compared(
    api: Harness,
    fakes: list[FakeWorker],
    whole: tuple[SigningKey, str, dict[str, Any]],
    edit: Callable[[dict[str, Any]], None],
    verdict: str,
    first: int | None,
) -> None:
    key, fp, body = whole
    found = _replay(api, fakes, key, fp, _cut(body, [4]), body, tamper=edit)
    assert found["verdict"] == verdict and found["reason"] == CUT
    assert found["comparison"]["first_divergence"] == first


def test_a_whole_record_replayed_longer_is_still_diverged(
    api: Harness, fakes: list[FakeWorker], whole: tuple[SigningKey, str, dict[str, Any]]
) -> None:
    """Only a record marked ``aborted`` is compared by its start: a complete one that the
    replay runs past diverged where it ended."""
    key, fp, body = whole
    short = _cut(body, [4])
    del short["aborted"]
    verdict = _replay(api, fakes, key, fp, short, body)
    assert verdict["verdict"] == "diverged" and verdict["reason"] is None
    assert verdict["comparison"]["first_divergence"] == 4


def _set_token(output: dict[str, Any], at: int) -> None:
    ids = unpack_int32(output["choices"][0]["token_ids"])
    ids[at] = (ids[at] + 1) % 50_000
    output["choices"][0]["token_ids"] = pack_int32(ids)


def _set_logprob(output: dict[str, Any], at: int) -> None:
    lps = unpack_float32(output["choices"][0]["logprobs"])
    lps[at] -= 0.5
    output["choices"][0]["logprobs"] = pack_float32(lps)


def _shorten(output: dict[str, Any], keep: int) -> None:
    choice = output["choices"][0]
    choice["token_ids"] = pack_int32(unpack_int32(choice["token_ids"])[:keep])
    choice["logprobs"] = pack_float32(unpack_float32(choice["logprobs"])[:keep])
