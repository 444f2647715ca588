import base64
import hashlib
from datetime import UTC, datetime

import pytest

from ledger.checkpoint import (
    Checkpoint,
    note_key_hash,
    parse_checkpoint,
    previous_line,
    previous_size,
    sign_checkpoint,
    verifier_key,
    verify_checkpoint,
)
from ledger.errors import InvalidInput as InvalidInputError
from ledger.errors import VerificationError
from ledger.signing import SigningKey, public_key_raw

KEY = SigningKey.generate()
CP = Checkpoint("example.com/ledger", 1234, hashlib.sha256(b"root").digest())


def test_note_layout_follows_c2sp():
    note = sign_checkpoint(CP, KEY)
    lines = note.split("\n")
    assert lines[:3] == ["example.com/ledger", "1234", base64.b64encode(CP.root_hash).decode()]
    assert lines[3] == ""
    assert lines[4].startswith("\u2014 example.com/ledger ")
    blob = base64.b64decode(lines[4].rsplit(" ", 1)[1])
    assert blob[:4] == note_key_hash("example.com/ledger", KEY.public_key) and len(blob) == 68
    KEY.public_key.verify(blob[4:], CP.body().encode())
    assert note.endswith("\n")


def test_key_hash_and_vkey():
    expected = hashlib.sha256(
        b"example.com/ledger\n\x01" + public_key_raw(KEY.public_key)
    ).digest()[:4]
    assert note_key_hash("example.com/ledger", KEY.public_key) == expected
    vkey = verifier_key("example.com/ledger", KEY.public_key)
    name, khash, raw = vkey.split("+", 2)
    assert (name, khash) == ("example.com/ledger", expected.hex())
    assert base64.b64decode(raw)[1:] == public_key_raw(KEY.public_key)


def test_round_trip():
    assert verify_checkpoint(sign_checkpoint(CP, KEY), KEY.public_key) == CP


def test_other_key_is_refused():
    with pytest.raises(VerificationError) as err:
        verify_checkpoint(sign_checkpoint(CP, KEY), SigningKey.generate().public_key)
    assert err.value.code == "bad_checkpoint_signature"


@pytest.mark.parametrize(
    "edit",
    [
        lambda n: n.replace("1234", "1235", 1),
        lambda n: n.replace("example.com/ledger\n", "example.com/other\n", 1),
        lambda n: n[:40] + ("A" if n[40] != "A" else "B") + n[41:],
    ],
)
def test_edited_notes_are_refused(edit):
    with pytest.raises(VerificationError):
        verify_checkpoint(edit(sign_checkpoint(CP, KEY)), KEY.public_key)


@pytest.mark.parametrize(
    "note",
    ["", "a\n1\nAAAA\n", "a\nx\n" + base64.b64encode(b"0" * 32).decode() + "\n\n\u2014 a AAAA\n"],
)
def test_malformed_notes(note):
    with pytest.raises(VerificationError):
        parse_checkpoint(note)


@pytest.mark.parametrize("size", ["\u00b2", "\u0663", "-1", "01", "1 "])
def test_tree_size_must_be_plain_ascii_decimal(size):
    note = sign_checkpoint(CP, KEY).replace("\n1234\n", f"\n{size}\n", 1)
    with pytest.raises(VerificationError):
        verify_checkpoint(note, KEY.public_key)


def test_origin_with_spaces_is_refused():
    from ledger.errors import InvalidInput

    with pytest.raises(InvalidInput):
        sign_checkpoint(Checkpoint("has space", 1, CP.root_hash), KEY)


# -- the signed time (a C2SP extension line) --------------------------------------------------

AT = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC)
TIMED = Checkpoint("example.com/ledger", 1234, CP.root_hash, signed_at=AT)


def test_a_timestamp_is_an_extension_line_after_the_root_covered_by_the_signature():
    note = sign_checkpoint(TIMED, KEY)
    lines = note.split("\n")
    assert lines[3] == "Timestamp: 1796117415123456000"  # Unix nanoseconds
    assert lines[4] == ""
    blob = base64.b64decode(lines[5].rsplit(" ", 1)[1])
    KEY.public_key.verify(blob[4:], "\n".join(lines[:4]).encode() + b"\n")
    assert verify_checkpoint(note, KEY.public_key) == TIMED
    assert parse_checkpoint(note)[0].signed_at == AT


def test_the_timestamp_cannot_be_changed_without_the_key():
    note = sign_checkpoint(TIMED, KEY)
    with pytest.raises(VerificationError):
        verify_checkpoint(note.replace("415123456000", "415123457000"), KEY.public_key)
    with pytest.raises(VerificationError):  # nor dropped
        verify_checkpoint(note.replace("Timestamp: 1796117415123456000\n", ""), KEY.public_key)


def test_a_note_without_a_timestamp_still_verifies_and_bounds_no_time():
    old = sign_checkpoint(CP, KEY)
    assert "Timestamp" not in old
    cp = verify_checkpoint(old, KEY.public_key)
    assert cp.signed_at is None and cp.extensions == ()


def test_other_extension_lines_are_kept_and_signed():
    cp = Checkpoint("example.com/ledger", 7, CP.root_hash, AT, ("witness/v1 abc", "x"))
    note = sign_checkpoint(cp, KEY)
    assert verify_checkpoint(note, KEY.public_key) == cp
    with pytest.raises(VerificationError):
        verify_checkpoint(note.replace("witness/v1 abc", "witness/v1 abd"), KEY.public_key)


@pytest.mark.parametrize("value", ["", "-1", "01", "1.5", "12 ", "\u0663", "1" * 20])
def test_malformed_timestamps_are_refused(value):
    note = sign_checkpoint(TIMED, KEY).replace("1796117415123456000", value, 1)
    with pytest.raises(VerificationError):
        parse_checkpoint(note)


def test_two_timestamps_are_refused():
    note = sign_checkpoint(TIMED, KEY)
    doubled = note.replace("Timestamp: ", "Timestamp: 1\nTimestamp: ", 1)
    with pytest.raises(VerificationError):
        parse_checkpoint(doubled)


def test_a_naive_or_early_time_cannot_be_signed():
    from ledger.errors import InvalidInput

    for at in (datetime(2026, 1, 1), datetime(1969, 12, 31, tzinfo=UTC)):
        with pytest.raises(InvalidInput):
            sign_checkpoint(Checkpoint("o", 1, CP.root_hash, at), KEY)


def test_the_previous_checkpoint_line_is_signed_and_read():
    cp = Checkpoint("example.com/ledger", 9, CP.root_hash, AT, (previous_line(7),))
    note = sign_checkpoint(cp, KEY)
    assert "\nPrevious: 7\n" in note
    parsed = verify_checkpoint(note, KEY.public_key)
    assert previous_size(parsed) == 7
    assert previous_size(TIMED) is None  # a log's first note, or one signed before the line
    with pytest.raises(VerificationError):
        verify_checkpoint(note.replace("Previous: 7", "Previous: 6"), KEY.public_key)


@pytest.mark.parametrize(
    "lines",
    [
        ("Previous: ",),
        ("Previous: 0",),
        ("Previous: 07",),
        ("Previous: -1",),
        ("Previous: 9",),  # not smaller than the tree it precedes
        ("Previous: 12",),
        ("Previous: 1" + "0" * 19,),
        ("Previous: 3", "Previous: 4"),
    ],
)
def test_malformed_previous_lines_are_refused(lines):
    cp = Checkpoint("example.com/ledger", 9, CP.root_hash, AT, lines)
    with pytest.raises(VerificationError):
        previous_size(cp)
    with pytest.raises(InvalidInputError):
        previous_line(0)
