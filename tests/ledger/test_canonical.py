import copy
import functools
import json
import math

import orjson
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.canonical import canonicalize, digest_of, sha256_digest
from ledger.errors import InvalidInput


def test_rfc8785_orders_members_and_drops_whitespace():
    assert canonicalize({"b": 1, "a": [True, None, "x"]}) == b'{"a":[true,null,"x"],"b":1}'


def test_rfc8785_number_and_string_forms():
    # RFC 8785 section 3.2.2.3 / ES6 number serialization, and minimal string escaping
    assert canonicalize([1e21, 1e-7, 0.7, -0.0, 100]) == b"[1e+21,1e-7,0.7,0,100]"
    assert canonicalize("é\n\u2028") == '"é\\n\u2028"'.encode()


@pytest.mark.parametrize("bad", [math.nan, math.inf, 2**60, {1: "x"}, "\ud800"])
def test_values_json_cannot_carry_exactly_are_refused(bad):
    with pytest.raises(InvalidInput) as err:
        canonicalize(bad)
    assert err.value.code == "not_canonicalizable"


def test_digests_are_algorithm_labelled():
    assert sha256_digest(b"") == (
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    assert digest_of({"a": 1}) == sha256_digest(b'{"a":1}')


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_key_order_does_not_change_the_canonical_form(value):
    if isinstance(value, dict):
        reordered = dict(reversed(list(value.items())))
        assert canonicalize(reordered) == canonicalize(value)


any_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def _integer_digits_beyond_the_safe_range(value) -> bool:
    """Whether RFC 8785 writes some number in ``value`` as integer digits beyond 2**53 - 1."""
    if isinstance(value, float):
        return 2.0**53 <= abs(value) < 1e21
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, list) and any(map(_integer_digits_beyond_the_safe_range, value))


@settings(max_examples=1000)
@given(any_json)
def test_byte_identical_to_the_rfc8785_reference(value):
    if _integer_digits_beyond_the_safe_range(value):
        with pytest.raises(InvalidInput):
            canonicalize(value)
    else:
        assert canonicalize(value) == rfc8785.dumps(value)


every_number = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(2**53 - 2, 2**53 + 2)
    | st.floats()
    | st.floats(2.0**52, 1e22)
    | st.floats(-1e22, -(2.0**52))
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=2000)
@given(every_number)
def test_canonical_bytes_read_back_to_themselves(value):
    # What is signed is read back later (the audit, a verifier, a bundle): canonical bytes
    # must parse, with either parser the project uses, to a value with the same bytes.
    try:
        out = canonicalize(value)
    except InvalidInput:
        return
    assert canonicalize(json.loads(out)) == out
    assert canonicalize(orjson.loads(out)) == out


@pytest.mark.parametrize(
    "value", [2.0**53, -(2.0**53), 2.0**53 + 2, -3.607410259360783e16, 1e16, 1e21 - 2**17]
)
def test_integral_floats_beyond_the_safe_range_are_refused_like_their_integers(value):
    # RFC 8785 writes them as integer digits ("9007199254740992"), which read back as an
    # integer beyond the safe range: the audit could not canonicalize a logged envelope.
    with pytest.raises(InvalidInput) as err:
        canonicalize({"seed": value})
    assert err.value.code == "not_canonicalizable"
    assert canonicalize(1e21) == b"1e+21"


@given(st.lists(st.integers(-(2**53) + 1, 2**53 - 1), min_size=1, max_size=50))
def test_integer_arrays_match_the_reference(values):
    assert canonicalize({"ids": values}) == rfc8785.dumps({"ids": values})


def test_member_names_sort_by_utf16_code_units():
    # U+FFFD sorts after U+1F600 in UTF-16 (surrogates D83D..) but before it by code point
    value = {"\ufffd": 1, "\U0001f600": 2, "a": 3}
    assert canonicalize(value) == rfc8785.dumps(value)
    assert canonicalize(value).index("😀".encode()) < canonicalize(value).index("\ufffd".encode())


@pytest.mark.parametrize("bad", [[2**53], [1, -(2**53)], {"k": [True, 2**60]}, object()])
def test_more_values_that_are_refused(bad):
    with pytest.raises(InvalidInput):
        canonicalize(bad)


@settings(max_examples=1000)
@given(st.text())
def test_strings_alone_match_the_reference(text):
    # a lone string (an envelope's kind, key ID, signature) goes straight to orjson
    assert canonicalize(text) == rfc8785.dumps(text)


def test_control_characters_use_rfc8785_escapes():
    s = "".join(chr(c) for c in range(0x20)) + '"\\\x7f'
    assert canonicalize(s) == rfc8785.dumps(s)


@pytest.mark.parametrize(
    "text",
    [
        "A" * 100,
        "A" * 100 + '"',
        "A" * 100 + "\\",
        "A" * 100 + "\x1f",
        "A" * 100 + "\x7f",
        "A" * 100 + "é",
        "A" * 100 + "\U0001f600",
        "\n" + "A" * 100,
    ],
)
def test_long_strings_take_the_fast_path_only_when_no_escape_is_needed(text):
    assert canonicalize({text: text}) == rfc8785.dumps({text: text})


@settings(max_examples=2000)
@given(
    st.floats(min_value=1e-4, max_value=2.0**53, exclude_max=True)
    | st.floats(min_value=-(2.0**53), max_value=-1e-4, exclude_min=True)
    | st.integers(-(2**53) + 1, 2**53 - 1).map(float)
)
def test_floats_on_the_fast_path_match_the_reference(value):
    assert canonicalize(value) == rfc8785.dumps(value)
    assert canonicalize([value, 1]) == rfc8785.dumps([value, 1])


@pytest.mark.parametrize(
    "value",
    [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.7,
        1e-4,
        9.999999999999999e-05,
        1e-7,
        1e-6,
        123456789.125,
        2.0**53 - 1,
        1e21,
        1e22,
        5e-324,
        1.7976931348623157e308,
        0.1 + 0.2,
        100.0,
        1e15 + 0.5,
        -1e22,
    ],
)
def test_float_boundaries_match_the_reference(value):
    assert canonicalize(value) == rfc8785.dumps(value)


def test_integer_lists_with_booleans_take_the_general_path():
    value = [1, True, 2, False]
    assert canonicalize(value) == b"[1,true,2,false]" == rfc8785.dumps(value)
    assert canonicalize([True, 1]) == b"[true,1]"


@pytest.mark.parametrize(
    "value",
    [
        {"t": 0.0, "n": [1.0, -0.0, 2.5, {"x": 3.0, "y": [4.0]}], "s": "x"},
        [[1, 2.0], [3.0, "a"], {"z": 2.0**53 - 1}],
        {"k": [1e-5, 1], "m": 0.7},
        {"é": 1.0, "a": 0.5},
        {"a": [1, 2, 3], "b": [1, 2.0], "c": [2**53 - 1, -(2**53) + 1]},
        functools.reduce(
            lambda inner, _: {"d": [inner, 1.0]}, range(130), 0.5
        ),  # deeper than orjson goes,
    ],
)
def test_both_paths_match_the_reference_and_leave_the_input_alone(value):
    before = copy.deepcopy(value)
    assert canonicalize(value) == rfc8785.dumps(value)
    # integral floats are rewritten in a copy, never in place (repr tells 2.0 from 2; == does not)
    assert repr(value) == repr(before)


def test_tuples_and_subclasses_canonicalize_as_their_json_types():
    class Name(str):
        pass

    assert canonicalize((1, 2.0, (True, None))) == b"[1,2,[true,null]]"
    assert canonicalize({Name("b"): Name("x"), "a": 1}) == b'{"a":1,"b":"x"}'
