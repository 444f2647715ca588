"""The ``format`` check reuses what it parsed for members that bundles of one export share (the
keys, the fingerprint), and only for a member that is the same JSON: a value a JSON parser never
produces, in place of one that parsed, is parsed afresh and refused as it would be uncached."""

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest

from ledger.errors import VerificationError
from ledger.evidence_format import load_bundle, parse_bundle

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = json.loads((ROOT / "docs" / "examples" / "evidence-example.json").read_text())


class Text(str):
    pass


def _edited(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    bundle = copy.deepcopy(BUNDLE)
    node = bundle
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return bundle


def _refused(bundle: dict[str, Any]) -> None:
    with pytest.raises(VerificationError) as err:
        parse_bundle(bundle)
    assert err.value.details["check"] == "format"


def test_bundles_sharing_members_share_what_was_parsed_from_them() -> None:
    first, second = parse_bundle(copy.deepcopy(BUNDLE)), parse_bundle(copy.deepcopy(BUNDLE))
    assert first.collector is second.collector and first.fingerprint is second.fingerprint
    assert first.record is not second.record  # each bundle's own record is its own


FP_HASHES = list(BUNDLE["fingerprint"]["hashes"])
REG_HASHES = list(BUNDLE["keys"]["collector"]["registration"]["hashes"])
ENGINE_VERSION = ("fingerprint", "envelope", "body", "engine", "version")


@pytest.mark.parametrize(
    ("path", "parsed", "refused"),
    [
        # orjson writes NaN and the infinities as null: a cached null must not stand for them
        (ENGINE_VERSION, None, float("nan")),
        (ENGINE_VERSION, None, float("inf")),
        # orjson writes a tuple as an array; the format wants a JSON array
        (("fingerprint", "hashes"), FP_HASHES, tuple(FP_HASHES)),
        (("keys", "collector", "registration", "hashes"), REG_HASHES, tuple(REG_HASHES)),
        # a subclass of str; a boolean for an integer
        (("keys", "collector", "name"), "c", Text("c")),
        (("fingerprint", "leaf_index"), 1, True),
    ],
    ids=["nan", "infinity", "tuple", "tuple-in-keys", "str-subclass", "bool"],
)
def test_a_member_is_reused_only_for_the_same_json(
    path: tuple[str, ...], parsed: Any, refused: Any
) -> None:
    parse_bundle(_edited(path, parsed))  # the format holds: its parse is cached
    _refused(_edited(path, refused))


def test_an_edit_after_parsing_does_not_reach_the_next_bundle() -> None:
    bundle = copy.deepcopy(BUNDLE)
    parse_bundle(bundle)
    bundle["keys"]["collector"]["name"] = "edited afterwards"
    assert parse_bundle(copy.deepcopy(BUNDLE)).collector.name == BUNDLE["keys"]["collector"]["name"]


def test_a_large_member_is_parsed_but_not_kept() -> None:
    """Members are kept before any signature is checked: a hostile one is not kept."""
    from ledger.evidence_format import _parsed

    _parsed.cache_clear()
    parse_bundle(copy.deepcopy(BUNDLE))
    assert _parsed.cache_info().currsize == 2  # the example's keys and its fingerprint
    for n in range(3):
        pad = ("keys", "collector", "registration", "envelope", "body", "pad")
        large = parse_bundle(_edited(pad, str(n) * 70_000))  # parsed, not kept
        assert large.collector.registration.envelope.body["pad"] == str(n) * 70_000
    assert _parsed.cache_info().currsize == 2


def test_a_member_named_many_times_is_refused_at_once() -> None:
    """The names repeated are found in one pass (a count per name was quadratic)."""
    names = ", ".join(f'"m{i}": {i}' for i in range(60_000))
    text = json.dumps(BUNDLE)[:-1] + ', "extra": {' + names + ', "m1": 0}}'
    started = time.perf_counter()
    with pytest.raises(VerificationError) as err:
        load_bundle(text.encode())
    assert time.perf_counter() - started < 5  # was minutes; a generous bound for slow hosts
    assert err.value.details["check"] == "format" and "'m1'" in err.value.message


def test_a_bundle_nested_too_deeply_fails_the_format_check() -> None:
    text = json.dumps(BUNDLE)[:-1] + ', "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(VerificationError) as err:
        load_bundle(text.encode())
    assert err.value.details["check"] == "format"


def test_a_bundle_file_must_be_utf8_text() -> None:
    """``ledger verify`` reads a file as the browser's verifier does: strict UTF-8 (an encoded
    surrogate, even in the unsigned ``exported_at``, is refused), a leading BOM skipped."""
    from ledger.errors import VerificationError
    from ledger.evidence_format import load_bundle

    assert load_bundle(b'\xef\xbb\xbf{"a": "b"}') == {"a": "b"}
    for data in (b'{"exported_at": "\xed\xa0\x80"}', '{"a": 1}'.encode("utf-16")):
        with pytest.raises(VerificationError) as refused:
            load_bundle(data)
        assert refused.value.details["check"] == "format"


def test_a_file_of_millions_of_empty_containers_is_refused_before_parsing() -> None:
    """Parsed, ``{},`` costs Python about 30 times its three bytes: a file of them under the
    CLI's size limit took gigabytes before its format was looked at. Brackets inside strings
    are text, not containers."""
    from ledger.evidence_format import MAX_CONTAINERS

    many = b"[" + b"{}," * MAX_CONTAINERS + b"{}]"
    with pytest.raises(VerificationError, match="more than 1,000,000 JSON objects") as err:
        load_bundle(many)
    assert err.value.details["check"] == "format"
    quoted = b'{"x": "' + b"{[" * MAX_CONTAINERS + b'\\"{"}'
    assert load_bundle(quoted) == {"x": "{[" * MAX_CONTAINERS + '"{'}
