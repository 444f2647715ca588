"""Ingest of schema v2 records on both backends: a reused or patterned salt, and content
hidden in the clear members, are refused before anything is written."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest

from ledger import disclosures
from ledger.errors import InvalidInput, LedgerError, NotFound, VerificationError
from ledger.record_v2 import commit_record, content_members
from ledger.records import RECORD_KIND
from ledger.signing import sign_envelope
from ledger.storage import erasures, ingest, queries, verdicts
from ledger.storage.database import Database
from tests.support.documents import (
    record_body,
    record_item_salted,
    record_item_v2,
    salt_in,
    verdict_body,
)
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


def _salt_refusal(err: LedgerError) -> dict[str, Any]:
    assert isinstance(err, VerificationError), err
    assert err.code == "invalid_disclosure" and err.details["check"] == "salt", err.details
    return err.details


def test_a_salt_another_record_used_is_refused_even_after_its_erasure(seeded: Seeded, db: Database):
    """A collector whose random source repeats (a forked process, a fixed seed) would disclose
    in one record the salt of another's content: with it, guesses of that content are
    confirmed against its digest, after its erasure or while a bundle withholds it."""
    first = record_item_v2(seeded.collector, seeded.fingerprint_id, text_prompt=True)
    (created,) = ingest.ingest_records(db, [first])
    details = _salt_refusal(
        _refused(db, [record_item_salted(seeded, salt_in(first.disclosures[2]))], VerificationError)
    )
    assert details["item"] == 0 and details["disclosure"] == 0
    assert details["log_index"] == created.log_index
    erasures.erase(
        db, seeded.log_key, created.request_id, reason="subject request", requested_by="t"
    )
    for d in first.disclosures:  # every salt of the erased record stays refused
        _salt_refusal(_refused(db, [record_item_salted(seeded, salt_in(d))], VerificationError))
    # the record itself sent again is a duplicate, not a reuse
    assert [r.status for r in ingest.ingest_records(db, [first])] == ["duplicate"]


def test_two_records_of_one_batch_sharing_a_salt_are_refused(seeded: Seeded, db: Database):
    first = record_item_v2(seeded.collector, seeded.fingerprint_id)
    fresh = record_item_v2(seeded.collector, seeded.fingerprint_id)
    again = record_item_salted(seeded, salt_in(first.disclosures[1]))
    details = _salt_refusal(_refused(db, [fresh, first, again], VerificationError))
    assert details["item"] == 2 and details["first_item"] == 1
    # a record repeated in its batch is one record, not a reuse
    statuses = [r.status for r in ingest.ingest_records(db, [first, fresh, first])]
    assert statuses == ["created", "created", "duplicate"]


def test_a_reused_salt_refuses_its_batch_alone_in_a_group(seeded: Seeded, db: Database):
    """Batches appended together (group commit): the one that reuses a salt gets the refusal
    naming it, the others go in as if appended one after the other."""
    a = record_item_v2(seeded.collector, seeded.fingerprint_id)
    b = record_item_salted(seeded, salt_in(a.disclosures[0]))
    c = record_item_v2(seeded.collector, seeded.fingerprint_id)
    held = record_item_v2(seeded.collector, seeded.fingerprint_id)
    ingest.ingest_records(db, [held])
    d = record_item_salted(seeded, salt_in(held.disclosures[1]))
    batches = [ingest.check_batch(db, [x]) for x in (a, b, c, d, held)]
    outcomes = ingest.write_batches(db, batches)
    assert [o[0].status for o in (outcomes[0], outcomes[2])] == ["created", "created"]
    assert outcomes[4][0].status == "duplicate"  # a held record sent again: no reuse
    assert isinstance(outcomes[1], LedgerError) and isinstance(outcomes[3], LedgerError)
    # a record appended before it in the group: named by its request ID (no leaf yet)
    assert _salt_refusal(outcomes[1])["request_id"] == a.envelope["body"]["request_id"]
    assert (
        _salt_refusal(outcomes[3])["log_index"]
        == queries.get_record(db, held.envelope["body"]["request_id"]).log_index
    )
    for refused in (b, d):
        with pytest.raises(NotFound):
            queries.get_record(db, refused.envelope["body"]["request_id"])


def _raw(salt: str) -> bytes:
    return base64.urlsafe_b64decode(salt + "=" * (-len(salt) % 4))


@pytest.mark.parametrize(
    "spelled",
    [
        lambda raw: _b64url(os.urandom(16) + raw),  # after fresh bytes
        lambda raw: _b64url(b"abc" + raw),  # shifted
        lambda raw: _b64url(raw + os.urandom(5)),  # lengthened
    ],
    ids=["after-16-fresh-bytes", "shifted-3", "lengthened"],
)
def test_a_salt_holding_an_accepted_one_at_any_offset_is_refused(
    seeded: Seeded, db: Database, spelled: Any
):
    """A random stream read again at another offset, or a collector that lengthens salts,
    gives back an accepted salt inside a new one: every 16 bytes of a salt count."""
    first = record_item_v2(seeded.collector, seeded.fingerprint_id)
    ingest.ingest_records(db, [first])
    salt = spelled(_raw(salt_in(first.disclosures[0])))
    _salt_refusal(_refused(db, [record_item_salted(seeded, salt)], VerificationError))


def test_a_salt_longer_than_64_bytes_is_refused(seeded: Seeded, db: Database):
    details = _salt_refusal(
        _refused(db, [record_item_salted(seeded, _b64url(os.urandom(65)))], VerificationError)
    )
    assert details["disclosure"] == 0
    assert ingest.ingest_records(db, [record_item_salted(seeded, _b64url(os.urandom(64)))])


def test_a_replay_output_reusing_a_salt_is_not_logged(seeded: Seeded, db: Database):
    """A replay's output is a disclosure of the record's content too (stored at the verdict's
    leaf, erased with the record), made by the ledger: a salt of it that repeats is the
    ledger's own fault (500 ``salt_reused``), and nothing is logged."""
    item = record_item_v2(seeded.collector, seeded.fingerprint_id)
    (created,) = ingest.ingest_records(db, [item])
    body = item.envelope["body"]

    def log(salt: str | None) -> Any:
        out = disclosures.make("replay_output", {"kind": "replay_output", "body": {}}, salt)
        verdict = verdict_body(body, created.log_index, "bitwise", output_digest=out.digest)
        return verdicts.append_verdict(db, seeded.log_key, verdict, [out.encoded]), out

    with pytest.raises(LedgerError) as err:
        log(salt_in(item.disclosures[0]))  # the record's own salt
    assert err.value.code == "salt_reused" and err.value.details["log_index"] == created.log_index
    stored, out = log(None)
    with pytest.raises(LedgerError) as err:
        log(out.salt)  # an output's salt, used again
    assert err.value.code == "salt_reused" and err.value.details["log_index"] == stored.log_index
    # and a record may not take a replay output's salt
    details = _salt_refusal(_refused(db, [record_item_salted(seeded, out.salt)], VerificationError))
    assert details["log_index"] == stored.log_index
    assert [v["replay_id"] for v in verdicts.verdicts_of(db, created.request_id)] == [stored.id]


def test_a_salt_accepted_between_check_and_append_is_refused(seeded: Seeded, db: Database):
    """A batch's salts are looked up under the append lock, with the group's: one that
    another batch appended after this one was checked is refused, that batch alone, naming
    the leaf that holds it, and nothing of it is written."""
    first = record_item_v2(seeded.collector, seeded.fingerprint_id)
    late = record_item_salted(seeded, salt_in(first.disclosures[0]))
    checked = ingest.check_batch(db, [late])
    (held,) = ingest.ingest_records(db, [first])
    (outcome,) = ingest.write_batches(db, [checked])
    assert isinstance(outcome, VerificationError) and outcome.code == "invalid_disclosure"
    assert outcome.details["check"] == "salt"
    assert outcome.details["log_index"] == held.log_index
    with pytest.raises(NotFound):
        queries.get_record(db, late.envelope["body"]["request_id"])
