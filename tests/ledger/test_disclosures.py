"""Salted disclosures and record schema v2 (pure): commitments that reveal nothing, open exactly.

The attack classes: guessing erased content from its digests (dictionary attack), a disclosure
that opens no digest or one twice, a bit flipped anywhere, ambiguous JSON (a member named
twice, a non-canonical form), a salt too short, a record ingested with part of its content,
clear sampling that lies about the request.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import disclosures
from ledger.canonical import canonicalize
from ledger.errors import Gone, InvalidInput, VerificationError
from ledger.inference_record import body_view, parse_record
from ledger.record_v2 import commit_record, is_redacted
from ledger.records import Choice, build_record_body

FP = "sha256:" + "ab" * 32


def _v1(prompt: str, request_extra: dict[str, object] | None = None) -> dict[str, object]:
    return build_record_body(
        request_id="req-1",
        fingerprint_id=FP,
        worker_id="w1",
        pool="p",
        tier=1,
        endpoint="/v1/completions",
        model="m",
        request={
            "model": "m",
            "prompt": prompt,
            "temperature": 0,
            "max_tokens": 3,
            **(request_extra or {}),
        },
        prompt_token_ids=[5, 6, 7],
        choices=[Choice([1, 2, 3], [-0.5, -0.25, -1.0], text=" yes")],
        started_at="2026-12-02T09:00:00Z",
        ttft_ns=1,
        total_ns=2,
        system_fingerprint=None,
        request_raw=base64.b64encode(json.dumps({"prompt": prompt}).encode()).decode(),
    )


def test_a_dictionary_attack_on_an_erased_record_confirms_no_candidate():
    candidates = [f"patient {i:05d} was diagnosed with condition {i % 97}" for i in range(10_000)]
    secret = candidates[4242]
    v1 = _v1(secret)
    body, erased = commit_record(v1)  # the disclosures are then erased: only the body remains
    digests = set(body["disclosure_digests"])
    assert body["disclosure_digests"] == sorted(digests)  # order says nothing
    hits = 0
    for candidate in candidates:
        request = {**v1["request"], "prompt": candidate}  # type: ignore[dict-item]
        raw = base64.b64encode(json.dumps({"prompt": candidate}).encode()).decode()
        guesses = [
            # every unsalted form an attacker might try, and the disclosure under a guessed salt
            "sha256:" + hashlib.sha256(canonicalize(request)).hexdigest(),
            "sha256:" + hashlib.sha256(canonicalize(candidate)).hexdigest(),
            "sha256:" + hashlib.sha256(canonicalize(["", "request", request])).hexdigest(),
            disclosures.make("request", request).digest,
            disclosures.make("request", request, salt="A" * 22).digest,
            disclosures.make("request_raw", raw).digest,
        ]
        hits += sum(g in digests for g in guesses)
    assert hits == 0
    # control: the same guess under the salt that was erased does confirm the secret, so the
    # loop above can find a hit; without the salt it finds none
    salt = next(d.salt for d in map(disclosures.parse, erased) if d.member == "request")
    assert disclosures.make("request", {**v1["request"], "prompt": secret}, salt).digest in digests  # type: ignore[dict-item]


def test_salts_are_fresh_and_long():
    a = disclosures.make("request", {"prompt": "x"})
    b = disclosures.make("request", {"prompt": "x"})
    assert a.salt != b.salt and a.digest != b.digest
    assert len(base64.urlsafe_b64decode(a.salt + "==")) >= 16


def test_a_v2_record_opens_into_its_v1_content_exactly():
    v1 = _v1("hello")
    body, encoded = commit_record(v1)
    assert set(body) >= {"sampling", "disclosure_digests"} and "request" not in body
    assert body["sampling"] == {"temperature": 0, "max_tokens": 3}
    record = parse_record(body, encoded, complete=True)
    assert record.complete and record.erasable
    assert record.content_view()["request"] == v1["request"]
    view = body_view({"envelope": {"body": body}, "disclosures": encoded})
    assert {k: v for k, v in view.items() if k != "schema_version"} == {
        k: v for k, v in v1.items() if k != "schema_version"
    }
    partial = parse_record(body, encoded[:2])
    assert not partial.complete and len(partial.missing_digests) == len(encoded) - 2
    with pytest.raises(Gone):
        partial.content_view()


def test_ingest_requires_every_digest_opened():
    body, encoded = commit_record(_v1("hello"))
    with pytest.raises(VerificationError) as missing:
        parse_record(body, encoded[:-1], complete=True)
    assert missing.value.code == "disclosures_missing"
    with pytest.raises(VerificationError) as twice:
        parse_record(body, [*encoded, encoded[0]], complete=True)
    assert twice.value.details["check"] == "unique"
    _, other = commit_record(_v1("hello"))
    with pytest.raises(VerificationError) as foreign:
        parse_record(body, [*encoded[:-1], other[0]], complete=True)
    assert foreign.value.details["check"] == "digest"


def test_clear_sampling_must_be_the_requests():
    body, encoded = commit_record(_v1("hello"))
    body["sampling"] = {"temperature": 0.7, "max_tokens": 3}
    with pytest.raises(InvalidInput) as lied:
        parse_record(body, encoded, complete=True)
    assert lied.value.code == "sampling_mismatch"


def _encode(value: object) -> str:
    return (
        base64.urlsafe_b64encode(value if isinstance(value, bytes) else canonicalize(value))
        .rstrip(b"=")
        .decode()
    )


@pytest.mark.parametrize(
    "encoded",
    [
        "",
        "not base64!",
        _encode(["A" * 22, "request"]),  # two members
        _encode(["A" * 8, "request", {}]),  # a short salt
        _encode(["A" * 22, "prompt", {}]),  # an unknown member
        _encode(b'["AAAAAAAAAAAAAAAAAAAAAA","request",{"a":1,"a":2}]'),  # a member twice
        _encode(b'["AAAAAAAAAAAAAAAAAAAAAA", "request", {}]'),  # not canonical
        _encode(b'["AAAAAAAAAAAAAAAAAAAAAA","request",NaN]'),
        _encode(["A" * 22, "request", {}]) + "=",  # padding
    ],
)
def test_malformed_disclosures_are_refused(encoded: str):
    with pytest.raises(VerificationError) as exc:
        disclosures.parse(encoded)
    assert exc.value.code == "invalid_disclosure" and exc.value.details["check"] == "encoding"


_BODY, _ENCODED = commit_record(_v1("property"))


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, len(_ENCODED) - 1)))
def test_every_subset_of_disclosures_opens_and_reports_the_rest_missing(subset: set[int]):
    chosen = [_ENCODED[i] for i in sorted(subset)]
    record = parse_record(_BODY, chosen)
    assert len(record.disclosed) == len(subset)
    assert len(record.missing_digests) == len(_ENCODED) - len(subset)
    assert record.complete == (len(subset) == len(_ENCODED))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(_ENCODED) - 1), st.data())
def test_a_flipped_bit_in_any_disclosure_opens_nothing(which: int, data: st.DataObject):
    raw = bytearray(_ENCODED[which].encode("ascii"))
    pos = data.draw(st.integers(0, len(raw) - 1))
    bit = data.draw(st.integers(0, 6))
    raw[pos] ^= 1 << bit
    flipped = raw.decode("ascii", errors="replace")
    with pytest.raises(VerificationError):
        parse_record(_BODY, [flipped])


def test_redact_names_select_members():
    assert is_redacted("request", ["prompt"]) and is_redacted("prompt_token_ids", ["prompt"])
    assert is_redacted("choices[3].text", ["text"]) and not is_redacted(
        "choices[3].text", ["prompt"]
    )
    assert is_redacted("choices[0].logprobs", ["logprobs"])
    assert is_redacted("choices[0].top_logprobs", ["choices[0].top_logprobs"])
    assert not is_redacted("choices[0].token_ids", ["logprobs", "request_raw"])


def _reference_unb64url(text: str) -> bytes:
    """The decoder the fast one replaced: translated to the standard alphabet, then the C
    decoder's strict mode."""
    if "+" in text or "/" in text or "=" in text or len(text) % 4 == 1:
        raise ValueError("not base64url without padding")
    data = text.encode("ascii").translate(bytes.maketrans(b"-_", b"+/")) + b"=" * (-len(text) % 4)
    return binascii.a2b_base64(data, strict_mode=True)


def _outcome(decode: Callable[[str], bytes], text: str) -> tuple[str, bytes]:
    try:
        return "decoded", decode(text)
    except (ValueError, UnicodeError):  # binascii.Error is a ValueError
        return "refused", b""


_B64_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/= \n.\x00\u00e9"


@settings(max_examples=3000)
@given(st.one_of(st.text(alphabet=_B64_CHARS, max_size=14), st.binary(max_size=64)))
def test_base64url_decoding_takes_and_refuses_what_the_strict_c_decoder_does(
    item: str | bytes,
) -> None:
    """Any text, and the encoding of any bytes with and without a stray character: the SIMD
    decoder (pybase64) agrees with ``binascii``'s strict mode on every one, so a disclosure
    is read, or refused, exactly as before (non-canonical trailing bits and all)."""
    if isinstance(item, bytes):
        encoded = base64.urlsafe_b64encode(item).rstrip(b"=").decode()
        texts = [encoded, encoded + "A", encoded[:-1], "=" + encoded, encoded + "\n"]
    else:
        texts = [item]
    for text in texts:
        assert _outcome(disclosures._unb64url, text) == _outcome(_reference_unb64url, text), text


@settings(max_examples=2000)
@given(
    st.one_of(
        st.text(alphabet=_B64_CHARS, min_size=18, max_size=30),
        st.binary(min_size=12, max_size=24).map(
            lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
        ),
    )
)
def test_a_salt_is_taken_exactly_when_it_decodes_to_16_bytes_or_more(salt: str) -> None:
    """``parse`` decides most salts without decoding them: it takes exactly those that the
    strict decoder reads as at least 16 bytes, and refuses the others as before."""
    encoded = base64.urlsafe_b64encode(canonicalize([salt, "request", {}])).rstrip(b"=").decode()
    outcome, raw = _outcome(_reference_unb64url, salt)
    expected = outcome == "decoded" and len(raw) >= disclosures.SALT_BYTES
    try:
        opened = disclosures.parse(encoded)
    except VerificationError as exc:
        assert not expected, salt
        assert exc.details["check"] == "encoding"
        assert "salt" in exc.message
    else:
        assert expected, salt
        assert opened.salt == salt and opened.digest == disclosures.digest_of(encoded)
