import copy
import math

import pytest

from ledger.errors import InvalidInput
from ledger.packing import pack_float32, pack_int32, unpack_float32
from ledger.records import is_request_id, validate_record_body
from tests.support.documents import record_body

FP = "sha256:" + "ab" * 32


def valid(**kw):
    return record_body(FP, top_k=3, seed=7, **kw)


def test_a_valid_record_summarizes_its_indexed_fields():
    body = valid(tier=2, pool="strict")
    s = validate_record_body(body)
    assert (s.fingerprint_id, s.tier, s.pool, s.model, s.output_tokens) == (
        FP,
        2,
        "strict",
        "test-model",
        8,
    )


def test_builder_packs_logprobs_as_float32():
    body = valid()
    lps = unpack_float32(body["choices"][0]["logprobs"])
    assert len(lps) == 8 and all(-5 <= x <= 0 for x in lps)


def mutate(path, value):
    body = valid()
    target = body
    for part in path[:-1]:
        target = target[part]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return body


DELETE = object()

CASES = [
    (("schema_version",), 2, "unsupported_schema_version"),
    (("request_id",), "has space", "schema_violation"),
    (("request_id",), "", "schema_violation"),
    (("fingerprint_id",), "md5:abc", "schema_violation"),
    (("tier",), 3, "schema_violation"),
    (("tier",), True, "schema_violation"),
    (("endpoint",), "/v1/embeddings", "schema_violation"),
    (("request",), "a string", "schema_violation"),
    (("choices",), [], "schema_violation"),
    (("usage", "prompt_tokens"), -1, "schema_violation"),
    (("timings", "started_at"), "yesterday", "schema_violation"),
    (("timings", "started_at"), "2026-11-29T09:00:00", "schema_violation"),
    (("timings", "ttft_ns"), 12, "schema_violation"),
    (("system_fingerprint",), 5, "schema_violation"),
    (("model",), DELETE, "schema_violation"),
    (("surprise",), 1, "schema_violation"),
    (("prompt_token_ids",), pack_int32([1, -2, 3]), "invalid_token_ids"),
    (("prompt_token_ids",), "@@@", "invalid_packing"),
    (("choices", 0, "token_ids"), pack_int32([5, -1]), "invalid_token_ids"),
    (("choices", 0, "logprobs"), pack_float32([-0.1, math.nan] + [-1.0] * 6), "invalid_logprobs"),
    (("choices", 0, "logprobs"), pack_float32([-0.1] * 7 + [math.inf]), "invalid_logprobs"),
    (("choices", 0, "logprobs"), pack_float32([-0.1] * 7), "length_mismatch"),
    (("choices", 0, "top_logprobs", "k"), 4, "length_mismatch"),
    (("choices", 0, "top_logprobs", "logprobs"), pack_float32([-1.0] * 23), "length_mismatch"),
    (("choices", 0, "index"), -1, "schema_violation"),
    (("choices", 0, "surprise"), 1, "schema_violation"),
]


@pytest.mark.parametrize(("path", "value", "code"), CASES, ids=[str(c[:2])[:60] for c in CASES])
def test_invalid_records_are_refused_with_a_stable_code(path, value, code):
    with pytest.raises(InvalidInput) as err:
        validate_record_body(mutate(path, value))
    assert err.value.code == code
    assert err.value.message


def test_duplicate_choice_indexes_are_refused():
    body = valid()
    body["choices"].append(copy.deepcopy(body["choices"][0]))
    with pytest.raises(InvalidInput, match="duplicate index"):
        validate_record_body(body)


@pytest.mark.parametrize("field", ["request_id", "worker_id", "pool"])
def test_a_trailing_newline_is_not_part_of_a_valid_name(field):
    body = valid()
    body[field] = body[field] + "\n"
    with pytest.raises(InvalidInput):
        validate_record_body(body)


@pytest.mark.parametrize("request_id", [".", "..", "", "a/b", "a b", "x" * 201])
def test_a_request_id_no_url_path_can_name_is_refused(request_id: str):
    assert not is_request_id(request_id)
    body = {**valid(), "request_id": request_id}
    with pytest.raises(InvalidInput):
        validate_record_body(body)


def test_dots_inside_a_request_id_are_fine():
    assert is_request_id("...") and is_request_id("a..b") and is_request_id(".x")
