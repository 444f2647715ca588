"""Ingest of schema v2 records on both backends: a reused or patterned salt, and content
hidden in the clear members, are refused before anything is written."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from ledger import disclosures
from ledger.errors import InvalidInput, LedgerError, NotFound, VerificationError
from ledger.record_v2 import commit_record, content_members
from ledger.records import RECORD_KIND
from ledger.signing import sign_envelope
from ledger.storage import ingest, queries
from ledger.storage.database import Database
from tests.support.documents import record_body, record_item_v2
from tests.support.seed import Seeded, seed_ledger

PII = "Patient Jane Roe, DOB 1970-01-01, HIV positive"


@pytest.fixture
def seeded(db: Database) -> Seeded:
    return seed_ledger(db)


def _item(seeded: Seeded, salt: Any = None, **changes: Any) -> ingest.RecordItem:
    """A v2 record whose v1 body got ``changes`` (choice members under ``choice``) and whose
    disclosures take ``salt(i)`` for the i-th member (fresh salts when None)."""
    v1 = record_body(seeded.fingerprint_id)
    v1["choices"] = [{**v1["choices"][0], **changes.pop("choice", {})}]
    v1.update(changes)
    body, encoded = commit_record(v1)
    if salt is not None:
        made = [
            disclosures.make(m, v, salt(i)) for i, (m, v) in enumerate(content_members(v1).items())
        ]
        body["disclosure_digests"] = sorted(d.digest for d in made)
        encoded = [d.encoded for d in made]
    return ingest.RecordItem(sign_envelope(RECORD_KIND, body, seeded.collector).to_dict(), encoded)


def _refused(db: Database, items: list[ingest.RecordItem], kind: type[LedgerError]) -> LedgerError:
    with pytest.raises(kind) as exc:
        ingest.ingest_records(db, items)
    for item in items:  # the batch is atomic: nothing of it was written
        with pytest.raises(NotFound):
            queries.get_record(db, item.envelope["body"]["request_id"])
    return exc.value


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "salt",
    [
        lambda i: _b64url(b"\x8f\x02\x11\xa7\x90\xce\x1b\x00\x5a\x3c\x77\xe1\x42\x09\xd4\x6b"),
        lambda i: "0" * 22,
        lambda i: "A" * 22 if i == 2 else _b64url(bytes([i + 1]) + bytes(range(15))),
        lambda i: _b64url(b"saltsaltsaltsalt"),
    ],
    ids=["one-salt-for-all", "zeros", "all-bytes-equal", "repeated-word"],
)
def test_a_record_with_a_reused_or_patterned_salt_is_refused(seeded: Seeded, db: Database, salt):
    good = record_item_v2(seeded.collector, seeded.fingerprint_id)
    err = _refused(db, [good, _item(seeded, salt)], VerificationError)
    assert err.code == "invalid_disclosure" and err.details["check"] == "salt"
    assert err.details["item"] == 1
    # with fresh salts the same batch goes in
    assert [r.status for r in ingest.ingest_records(db, [good, _item(seeded)])] == [
        "created",
        "created",
    ]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"timings": {"started_at": "2026-11-29T09:00:00Z", "debug_prompt": PII}}, "timings"),
        ({"usage": {"prompt_tokens": 12, "prompt_echo": {"text": PII}}}, "usage"),
        ({"system_fingerprint": "vllm-0.32.0-" + PII}, "system_fingerprint"),
        ({"choice": {"finish_reason": PII}}, "choices[0].finish_reason"),
        ({"choice": {"stop_reason": PII}}, "choices[0].stop_reason"),
    ],
)
def test_content_in_the_clear_members_is_refused(
    seeded: Seeded, db: Database, changes: dict, field: str
):
    err = _refused(db, [_item(seeded, **changes)], InvalidInput)
    assert err.code == "schema_violation" and err.details == {"field": field, "item": 0}
