import pytest

from ledger.errors import InvalidInput
from ledger.tokens import Principal, hash_token, new_token, parse_scopes, token_display_id


def test_tokens_are_random_and_stored_as_labelled_hashes():
    a, b = new_token(), new_token()
    assert a != b and a.startswith("lgr_") and len(a) > 40
    assert hash_token(a).startswith("sha256:") and a not in hash_token(a)
    assert token_display_id(a) == hash_token(a)[7:19]


def test_scopes_are_checked():
    assert parse_scopes("records:read, admin") == ("admin", "records:read")
    with pytest.raises(InvalidInput):
        parse_scopes(["records:delete"])
    with pytest.raises(InvalidInput):
        parse_scopes([])


def test_admin_implies_every_scope():
    assert Principal("t", "n", ("admin",)).allows("records:write")
    reader = Principal("t", "n", ("records:read",))
    assert reader.allows("records:read") and not reader.allows("records:write")
