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
import os
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import disclosures, record_v2
from ledger.canonical import canonicalize
from ledger.errors import Gone, InvalidInput, VerificationError
from ledger.inference_record import body_view, parse_record
from ledger.record_v2 import check_redact, commit_record, content_members, is_redacted
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


def _commit_with_salts(v1: dict[str, object], salts: Callable[[int], str]) -> tuple[dict, list]:
    """``commit_record`` of ``v1`` with the salts a collector chose: ``salts(i)`` for the i-th
    member (a collector that reuses one, or draws none)."""
    body, _ = commit_record(v1)
    made = [
        disclosures.make(member, value, salts(i))
        for i, (member, value) in enumerate(content_members(v1).items())
    ]
    body["disclosure_digests"] = sorted(d.digest for d in made)
    return body, [d.encoded for d in made]


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _salt_refused(body: dict, encoded: list) -> VerificationError:
    with pytest.raises(VerificationError) as exc:
        parse_record(body, encoded, complete=True)
    assert exc.value.code == "invalid_disclosure" and exc.value.details["check"] == "salt"
    return exc.value


def test_ingest_refuses_one_salt_for_every_member_and_verify_still_opens_it():
    """One salt for every disclosure: a bundle that redacts the prompt but carries one other
    disclosure gives its recipient the salt that confirms a guessed prompt."""
    shared = _b64url(b"\x8f\x02\x11\xa7\x90\xce\x1b\x00\x5a\x3c\x77\xe1\x42\x09\xd4\x6b")
    body, encoded = _commit_with_salts(_v1("diagnosis: positive"), lambda i: shared)
    refused = _salt_refused(body, encoded)
    assert refused.details["disclosure"] == 1 and refused.details["reuses"] == 0
    # what a ledger logged before the check keeps opening (a bundle, a read): ingest only
    assert parse_record(body, encoded).complete


@pytest.mark.parametrize(
    "second",
    [
        # the same 16 bytes, other trailing bits of the 22nd character
        lambda s: s[:-1] + ("B" if s[-1] == "A" else "A"),
        lambda s: s + "xyzw",  # the same salt, lengthened
    ],
    ids=["trailing-bits", "lengthened"],
)
def test_ingest_refuses_a_salt_reused_under_another_spelling(second: Callable[[str], str]):
    first = _b64url(bytes(range(16)))[:-1] + "A"
    body, encoded = _commit_with_salts(_v1("x"), lambda i: first if i == 0 else second(first))
    a, b = (disclosures.parse(e).salt for e in encoded[:2])
    assert a != b and disclosures.salt_keys(a)[0] in disclosures.salt_keys(b)
    assert _salt_refused(body, encoded).details["disclosure"] == 1


@pytest.mark.parametrize(
    "salt",
    [
        "A" * 22,  # 16 zero bytes
        "0" * 22,  # d3 4d 34 repeated: no entropy, not all bytes equal
        _b64url(b"salt" * 4),
        _b64url(b"\x01\x02\x03\x04\x05\x06\x07\x08" * 4),  # 32 bytes, an 8-byte pattern
    ],
)
def test_ingest_refuses_a_salt_without_entropy(salt: str):
    counter = iter(range(1000))
    body, encoded = _commit_with_salts(
        _v1("x"),
        lambda i: salt if i == 0 else _b64url(bytes([next(counter) + 1]) + bytes(range(15))),
    )
    refused = _salt_refused(body, encoded)
    assert refused.details["disclosure"] == 0 and "pattern" in refused.message


def test_fresh_salts_of_any_length_pass():
    lengths = iter([16, 17, 24, 32, 48, 64, 16, 16])
    body, encoded = _commit_with_salts(_v1("x"), lambda i: _b64url(os.urandom(next(lengths))))
    assert parse_record(body, encoded, complete=True).complete
    # a 32-byte salt made of two random 16-byte halves holds 128 random bits: taken
    half = os.urandom(16)
    body, encoded = _commit_with_salts(
        _v1("x"), lambda i: _b64url(half * 2) if i == 0 else _b64url(os.urandom(16))
    )
    assert parse_record(body, encoded, complete=True).complete


def _v1_with(**v1_changes: object) -> dict[str, object]:
    v1 = _v1("hello")
    choice = {**v1["choices"][0], **v1_changes.pop("choice", {})}  # type: ignore[index, dict-item]
    return {**v1, **v1_changes, "choices": [choice]}


def _v2(**v1_changes: object) -> tuple[dict, list]:
    return commit_record(_v1_with(**v1_changes))


_REQUEST = {"model": "m", "prompt": "p", "max_tokens": 3}
# vLLM's FINISH_REASON_STRINGS, and tool_calls (chat with a tool parser)
_VLLM_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition", "tool_calls")
_SMUGGLED = "Patient Jane Roe, DOB 1970-01-01, HIV positive"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"usage": {"prompt_tokens": 3, "prompt_echo": {"text": _SMUGGLED}}}, "usage"),
        ({"usage": {"note": 1}}, "usage"),
        ({"timings": {"started_at": "2026-12-02T09:00:00Z", "debug_prompt": _SMUGGLED}}, "timings"),
        ({"system_fingerprint": "vllm-0.32.0-" + _SMUGGLED}, "system_fingerprint"),
        ({"system_fingerprint": "v" * 101}, "system_fingerprint"),
        ({"system_fingerprint": ""}, "system_fingerprint"),
        ({"choice": {"finish_reason": _SMUGGLED}}, "choices[0].finish_reason"),
        ({"choice": {"finish_reason": "stopped"}}, "choices[0].finish_reason"),
        ({"choice": {"stop_reason": _SMUGGLED}}, "choices[0].stop_reason"),
        ({"choice": {"stop_reason": -1}}, "choices[0].stop_reason"),
        ({"choice": {"stop_reason": 2**31}}, "choices[0].stop_reason"),
        *(
            ({"request": _REQUEST | {name: value}}, f"sampling.{name}")
            for name, value in (
                ("temperature", _SMUGGLED),
                ("seed", {"note": _SMUGGLED}),
                ("n", [1, _SMUGGLED]),
                ("logprobs", "1" * 65),
                ("ignore_eos", "yes, " + _SMUGGLED),
                ("stop_token_ids", [2, _SMUGGLED]),
                ("stop_token_ids", "2"),
                ("top_p", "0x10"),
            )
        ),
    ],
)
def test_ingest_refuses_content_in_the_clear_members(change: dict, field: str):
    """What stays in the clear is never erased: a v2 record holds there only what a
    collector writes (v1 bodies, whose content is all in the clear, are not checked so)."""
    body, encoded = _v2(**change)
    with pytest.raises(InvalidInput) as exc:
        parse_record(body, encoded, complete=True)
    assert exc.value.code == "schema_violation" and exc.value.details["field"] == field
    assert parse_record(body, encoded).erasable  # a read of a logged record is unchanged
    v1 = _v1_with(**change)  # a v1 body holds its content in the clear anyway: as it was
    assert parse_record(v1, complete=True).summary.request_id == "req-1"


@pytest.mark.parametrize(
    "change",
    [
        {"system_fingerprint": "vllm-0.32.0-6ea389cc"},
        {"system_fingerprint": "vllm-0.11.1rc2.dev45+gabcdef-6ea389cc"},
        {"system_fingerprint": "sha256:" + "ab" * 32},  # --fingerprint-mode custom
        {"system_fingerprint": "unset"},
        {"system_fingerprint": None},
        *({"choice": {"finish_reason": word}} for word in _VLLM_FINISH_REASONS),
        {"choice": {"finish_reason": None, "stop_reason": None}},
        {"choice": {"finish_reason": "stop", "stop_reason": 2}},  # a stop token ID
        {"choice": {"finish_reason": "stop", "stop_reason": 2**31 - 1}},
        {"choice": {"finish_reason": "repetition", "stop_reason": "repetition_detected"}},
        {
            "request": {"model": "m", "prompt": "p", "max_tokens": 3, "stop": ["\n\n", "##"]},
            "choice": {"finish_reason": "stop", "stop_reason": "##"},
        },
        {
            "request": {"model": "m", "prompt": "p", "max_tokens": 3, "stop": "END"},
            "choice": {"finish_reason": "stop", "stop_reason": "END"},
        },
        # sampling values as vLLM's request models (pydantic, lax) take them, and as the
        # collector writes an integer beyond 2**53 (its decimal string)
        *(
            {"request": _REQUEST | {name: value}}
            for name, value in (
                ("temperature", " 0.5 "),
                ("temperature", "1e-3"),
                ("top_p", 1),
                ("seed", "18446744073709551615"),
                ("seed", None),
                ("ignore_eos", "yes"),
                ("logprobs", True),
                ("n", "+1"),
                ("max_tokens", "1_000"),
                ("stop_token_ids", [1, 2.0, "3"]),
                ("stop_token_ids", []),
                ("stop", ["a free stop string, in the clear by design"]),
            )
        ),
    ],
)
def test_what_vllm_answers_stays_accepted(change: dict):
    body, encoded = _v2(**change)
    assert parse_record(body, encoded, complete=True).complete


def test_a_stop_string_the_request_did_not_give_is_refused():
    request = {"model": "m", "prompt": "p", "max_tokens": 3, "stop": ["##"]}
    body, encoded = _v2(request=request, choice={"finish_reason": "stop", "stop_reason": "#"})
    with pytest.raises(InvalidInput) as exc:
        parse_record(body, encoded, complete=True)
    assert exc.value.details["field"] == "choices[0].stop_reason"


@pytest.mark.parametrize(
    "name",
    [
        "choices[0].margins",
        "replay_output",
        "choices[99999].text",
        "choices[10001].text",
        "choices[01].text",
        "choices[0]",
        "secrets",
        "Text",
    ],
)
def test_redact_refuses_names_no_record_holds(name: str):
    with pytest.raises(InvalidInput) as exc:
        check_redact(["text", name])
    err = exc.value
    assert err.code == "invalid_parameters" and err.details["unknown"] == [name]
    assert "choices[N].text" in err.details["members"] and "prompt" in err.details["groups"]


def test_redact_takes_every_member_and_group():
    names = [
        *record_v2.REDACT_GROUPS,
        "request",
        "request_raw",
        "prompt_token_ids",
        "top_logprobs",
        "choices[0].token_ids",
        "choices[10000].top_logprobs",
    ]
    assert check_redact(names) == tuple(names)
