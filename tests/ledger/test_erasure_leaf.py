"""``queries.logged_erasure``: an ``erasures`` row counts only when the leaf it names is what
``ledger.erasure.erasure_body`` logs for that very record; any other leaf is IndexMismatch,
with the row's leaf and request ID in its details."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ledger.erasure import ERASURE_KIND, HOLD_KIND, erasure_body, hold_body
from ledger.errors import IndexMismatch
from ledger.signing import SigningKey, sign_envelope
from ledger.storage.queries import logged_erasure

RID = "req-erased"
RECORD_INDEX = 7
CONTENT_HASH = "sha256:" + "a" * 64
DIGESTS = ["sha256:" + c * 64 for c in "123"]
KEY = SigningKey.generate()


def _event(**changes: Any) -> dict[str, Any]:
    body = erasure_body(
        request_id=RID,
        log_index=RECORD_INDEX,
        content_hash=CONTENT_HASH,
        erased_digests=[*DIGESTS, "sha256:" + "f" * 64],  # and a replay output's
        reason_code="request",
        reason="GDPR Art. 17",
        requested_by="officer",
        erased_at="2026-12-02T12:30:41.190297Z",
    )
    return {**body, **changes}


def _read(envelope: Any, log_index: Any = 12) -> Any:
    return logged_erasure(
        envelope,
        log_index,
        request_id=RID,
        record_index=RECORD_INDEX,
        content_hash=CONTENT_HASH,
        digests=DIGESTS,
    )


def test_the_records_own_erasure_event_is_read():
    envelope = sign_envelope(ERASURE_KIND, _event(), KEY).canonical
    event = _read(envelope)
    assert event.log_index == 12 and event.envelope == envelope
    assert event.body["request_id"] == RID and event.body["reason"] == "GDPR Art. 17"


def _signed(kind: str, body: dict[str, Any]) -> bytes:
    return sign_envelope(kind, body, KEY).canonical


HOLD = hold_body(
    hold_id="hold-" + "0" * 24, request_id=RID, filter=None, reason="case", placed_by="t"
)
FORGED: dict[str, Callable[[], Any]] = {
    "a hold's leaf": lambda: _signed(HOLD_KIND, HOLD),
    "another record's erasure": lambda: _signed(ERASURE_KIND, _event(request_id="req-other")),
    "another leaf of the record": lambda: _signed(
        ERASURE_KIND, _event(record={"log_index": 3, "content_hash": CONTENT_HASH})
    ),
    "another version of the record": lambda: _signed(
        ERASURE_KIND,
        _event(record={"log_index": RECORD_INDEX, "content_hash": "sha256:" + "b" * 64}),
    ),
    "a digest left out": lambda: _signed(ERASURE_KIND, _event(erased_digests=DIGESTS[:2])),
    "no erased_digests list": lambda: _signed(ERASURE_KIND, _event(erased_digests="all")),
    "not JSON": lambda: b"\x00not json",
    "no leaf at all": lambda: None,
}


@pytest.mark.parametrize("forged", sorted(FORGED))
def test_any_other_leaf_is_an_index_mismatch(forged: str):
    with pytest.raises(IndexMismatch) as raised:
        _read(FORGED[forged]())
    assert raised.value.code == "index_mismatch"
    assert raised.value.details == {"log_index": 12, "request_id": RID}
    assert RID in raised.value.message and "ledger audit" in raised.value.message


def test_an_event_logged_before_the_record_is_an_index_mismatch():
    envelope = sign_envelope(ERASURE_KIND, _event(), KEY).canonical
    with pytest.raises(IndexMismatch):
        _read(envelope, log_index=RECORD_INDEX - 1)
