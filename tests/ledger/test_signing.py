import base64
import copy

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.canonical import canonicalize
from ledger.errors import InvalidInput, VerificationError
from ledger.secretfile import SecretFileExists
from ledger.signing import (
    Envelope,
    SigningKey,
    VerifyingKey,
    cached_verifying_key,
    key_id_for,
    load_public_key,
    public_key_pem,
    public_key_raw,
    sign_envelope,
    verify_envelope,
    verify_signature,
)

KEY = SigningKey.generate()


def test_key_id_is_labelled_sha256_of_raw_public_key():
    import hashlib

    raw = public_key_raw(KEY.public_key)
    assert KEY.key_id == "ed25519:" + hashlib.sha256(raw).hexdigest()


def test_sign_and_verify():
    env = sign_envelope("inference_record", {"a": 1, "b": "x"}, KEY)
    assert env.signature["alg"] == "ed25519"
    verify_envelope(env, KEY.public_key)  # raises on failure


def test_signature_covers_the_canonical_body_only():
    env = sign_envelope("k", {"b": 2, "a": 1}, KEY)
    sig = base64.b64decode(env.sig)
    KEY.public_key.verify(sig, b'{"a":1,"b":2}')


def test_tampered_body_fails_verification():
    env = sign_envelope("k", {"logprob": "AAAAAA=="}, KEY)
    forged = Envelope(kind="k", body={"logprob": "AAAAAB=="}, key_id=env.key_id, sig=env.sig)
    with pytest.raises(VerificationError) as err:
        verify_envelope(forged, KEY.public_key)
    assert err.value.code == "bad_signature"


def test_other_key_fails_verification():
    env = sign_envelope("k", {"a": 1}, KEY)
    other = SigningKey.generate()
    with pytest.raises(VerificationError) as err:
        verify_envelope(env, other.public_key)
    assert err.value.code == "key_mismatch"


def test_a_verifying_key_holds_the_raw_key_and_its_id():
    env = sign_envelope("k", {"a": 1}, KEY)
    key = VerifyingKey.of(KEY.public_key)
    assert (key.raw, key.key_id) == (public_key_raw(KEY.public_key), KEY.key_id)
    assert VerifyingKey.of(key) is key
    verify_envelope(env, key)
    text = "ed25519:" + base64.b64encode(key.raw).decode()
    assert cached_verifying_key(text) == key
    assert cached_verifying_key(text) is cached_verifying_key(text)
    other = VerifyingKey.of(SigningKey.generate().public_key)
    with pytest.raises(VerificationError) as err:
        verify_envelope(env, other)
    assert err.value.code == "key_mismatch"
    # a key whose ID was forged to match still fails on the signature itself
    with pytest.raises(VerificationError) as err:
        verify_envelope(env, VerifyingKey(other.raw, KEY.key_id))
    assert err.value.code == "bad_signature"
    with pytest.raises(InvalidInput):
        cached_verifying_key("ed25519:not-base64")


def test_garbage_signature_fails_verification():
    env = sign_envelope("k", {"a": 1}, KEY)
    bad = Envelope(kind="k", body=env.body, key_id=env.key_id, sig="!!!")
    with pytest.raises(VerificationError):
        verify_envelope(bad, KEY.public_key)


# Ed25519's group order L; S + L is the same scalar in a non-canonical encoding
ORDER_L = 2**252 + 27742317777372353535851937790883648493


def _verifies(public_key, signature, message):
    try:
        verify_signature(public_key, signature, message)
    except VerificationError as exc:
        assert exc.code == "bad_signature"
        return False
    return True


@pytest.mark.parametrize("size", [0, 63, 65, 128])
def test_a_signature_of_the_wrong_length_never_verifies(size):
    message = b"x" * 100
    sig = KEY.private_key.sign(message)
    assert _verifies(KEY.public_key, sig, message)
    # 63 bytes + the message's first byte must not be read as a signature of the rest
    forged = (sig * 2)[:size]
    assert not _verifies(KEY.public_key, forged, message)
    assert not _verifies(KEY.public_key, sig[:-1], bytes([sig[-1]]) + message)


def test_the_verifier_refuses_what_openssl_refuses_and_more():
    message = canonicalize({"a": 1})
    sig = KEY.private_key.sign(message)
    s = int.from_bytes(sig[32:], "little")
    malleated = sig[:32] + (s + ORDER_L).to_bytes(32, "little")
    assert not _verifies(KEY.public_key, malleated, message)  # non-canonical S
    flipped = bytes([sig[0] ^ 1]) + sig[1:]
    assert not _verifies(KEY.public_key, flipped, message)
    # the identity point as public key and as R, with S = 0, "signs" every message for a
    # verifier that accepts small-order points (OpenSSL, through cryptography 50, does)
    # (load_public_key refuses such a key: tests/ledger/test_small_order_keys.py)
    identity = (1).to_bytes(32, "little")
    weak_key = Ed25519PublicKey.from_public_bytes(identity)
    assert not _verifies(weak_key, identity + bytes(32), message)


json_bodies = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=10,
    ),
    max_size=6,
)


@settings(max_examples=200)
@given(json_bodies, st.text(min_size=1, max_size=20))
def test_envelope_canonical_bytes_equal_jcs_of_the_whole_envelope(body, kind):
    env = sign_envelope(kind, body, KEY)
    assert env.canonical == canonicalize(env.to_dict())


def test_envelope_parsing_is_strict():
    env = sign_envelope("k", {"a": 1}, KEY).to_dict()
    for broken, code in [
        ([], "schema_violation"),
        ({**env, "extra": 1}, "schema_violation"),
        ({**env, "body": []}, "schema_violation"),
        ({**env, "kind": ""}, "schema_violation"),
        ({**env, "signature": {"alg": "ed25519"}}, "schema_violation"),
        ({**env, "signature": {**env["signature"], "alg": "rsa"}}, "unsupported_algorithm"),
    ]:
        with pytest.raises(InvalidInput) as err:
            Envelope.from_dict(copy.deepcopy(broken))
        assert err.value.code == code


def test_key_files_round_trip(tmp_path):
    KEY.write(tmp_path / "k.pem", tmp_path / "k.pub.pem")
    assert (tmp_path / "k.pem").stat().st_mode & 0o777 == 0o600
    assert SigningKey.load(tmp_path / "k.pem").key_id == KEY.key_id
    assert key_id_for(load_public_key((tmp_path / "k.pub.pem").read_text())) == KEY.key_id
    with pytest.raises(SecretFileExists):
        KEY.write(tmp_path / "k.pem")


def test_public_key_forms():
    raw = base64.b64encode(public_key_raw(KEY.public_key)).decode()
    assert key_id_for(load_public_key("ed25519:" + raw)) == KEY.key_id
    assert key_id_for(load_public_key(public_key_pem(KEY.public_key))) == KEY.key_id
    with pytest.raises(InvalidInput):
        load_public_key("ed25519:AAAA")


_STORED = [
    b'{"body":{"a":1},"kind":"k","signature":{"alg":"ed25519","key_id":"x","sig":"y"}}',
    b'{"body":{"a":"\\ud800"},"kind":"k","signature":{"alg":"ed25519","key_id":"x","sig":"y"}}',
    b'{"body":{"a":NaN},"kind":"k","signature":{"alg":"ed25519","key_id":"x","sig":"y"}}',
    b'{"body":{"a":123456789012345678901234567890},"kind":"k",'
    b'"signature":{"alg":"ed25519","key_id":"x","sig":"y"}}',
    b'{"body":{"a":1,"a":2},"kind":"k","signature":{"alg":"ed25519","key_id":"x","sig":"y"}}',
    '{"body":{"a":1},"kind":"k","signature":{"alg":"ed25519","key_id":"x","sig":"y"}}'.encode(
        "utf-16"
    ),
    b'{"body":' + b'{"a":' * 2000 + b"1" + b"}" * 2000 + b',"kind":"k",'
    b'"signature":{"alg":"ed25519","key_id":"x","sig":"y"}}',
    b'{"body":{},"kind":"k"',
    b"\xff\xfe\x00",
    b'["not", "an", "envelope"]',
]


@pytest.mark.parametrize("data", _STORED)
def test_envelope_from_bytes_is_from_dict_of_json_loads(data):
    """Whatever the stored bytes hold, parsing them gives what json.loads gives: the same
    envelope, or a refusal of the same class (orjson only speeds up the texts it accepts),
    except an integer beyond 64 bits, read as a float, whose canonical form then differs."""
    import json

    try:
        expected = Envelope.from_dict(json.loads(data))
    except InvalidInput as exc:
        try:
            got = Envelope.from_bytes(data)
        except InvalidInput as again:
            assert again.code == exc.code
            return
        assert b"123456789012345678901234567890" in data  # the one exception
        assert got.canonical != data
        return
    except (ValueError, RecursionError):
        with pytest.raises(ValueError):
            Envelope.from_bytes(data)
        return
    got = Envelope.from_bytes(data)
    assert (got.kind, got.body, got.key_id, got.sig) == (
        expected.kind,
        expected.body,
        expected.key_id,
        expected.sig,
    )
    assert got.canonical == expected.canonical
