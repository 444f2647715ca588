import math

import pytest
from hypothesis import given
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
