"""Inference records, schema version 2: the signed body commits to its content, holds none.

A v2 body is a v1 body (``ledger.records``) whose content members are replaced by the sorted
digests of salted disclosures (``ledger.disclosures``), with the sampling parameters copied
into the clear:

    {
      "schema_version": 2,
      "request_id", "fingerprint_id", "worker_id", "pool", "tier", "endpoint", "model",
      "sampling": {"temperature": 0, "seed": 7, "max_tokens": 16, ...},  # SAMPLING members
                                                                        # of the request
      "choices": [{"index": 0, "finish_reason": "length", "stop_reason": null}],
      "usage", "timings", "system_fingerprint", "aborted",               # as in v1
      "disclosure_digests": ["sha256:…", …]                             # sorted
    }

Committed (erasable) members, each one disclosure: ``request`` (the whole request sent to the
engine: prompt or messages and every other field), ``request_raw`` (its exact bytes, when
kept), ``prompt_token_ids``, and per choice ``choices[N].token_ids``, ``.text``, ``.logprobs``
and ``.top_logprobs`` (those the v1 body would have held). Their values are exactly the v1
members' (packed arrays stay packed), so the v1 checks apply to them unchanged.

At ingest every digest must be opened (:func:`open_record`): a record's content is complete
when logged, and only an erasure event may later remove any of it. Ingest also bounds what
stays in the clear, so that no content hides there, out of an erasure's reach
(:func:`check_clear_values`): ``usage`` and ``timings`` hold only the members a collector
writes, ``system_fingerprint`` is a short label, ``finish_reason`` one of the engine's words
and ``stop_reason`` a token ID, one of the request's stop strings or the engine's word; and
each disclosure's salt is fresh (``ledger.disclosures.check_salts``). A version 1 body holds
its content in the clear anyway, and is not checked so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ledger.canonical import canonicalize
from ledger.disclosures import (
    Disclosure,
    check_digests,
    check_salts,
    commit,
    open_disclosures,
)
from ledger.errors import InvalidInput, VerificationError

SCHEMA_VERSION = 2
DIGESTS = "disclosure_digests"
# Request members that stay in the clear (they decide determinism and say how it was sampled).
SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "n",
    "best_of",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
)
CHOICE_CLEAR = ("index", "finish_reason", "stop_reason")
CHOICE_CONTENT = ("token_ids", "text", "logprobs", "top_logprobs")
REQUIRED_MEMBERS = ("request", "prompt_token_ids")
CLEAR = (
    "schema_version",
    "request_id",
    "fingerprint_id",
    "worker_id",
    "pool",
    "tier",
    "endpoint",
    "model",
    "sampling",
    "choices",
    "usage",
    "timings",
    "system_fingerprint",
    DIGESTS,
)
OPTIONAL_CLEAR = ("aborted",)
# What a v2 body's clear members may hold (checked at ingest, check_clear_values): the members
# the builder (ledger.records.build_record_body) writes, the words vLLM answers.
USAGE = ("prompt_tokens", "completion_tokens", "total_tokens")
TIMINGS = ("started_at", "ttft_ns", "total_ns")
# vLLM's FINISH_REASON_STRINGS, tool_calls (chat, when a tool parser found calls) and the rest
# of OpenAI's vocabulary.
FINISH_REASONS = (
    "stop",
    "length",
    "abort",
    "error",
    "repetition",
    "tool_calls",
    "content_filter",
    "function_call",
)
# stop_reason strings vLLM sets itself (else it is a stop string of the request, or a token ID)
ENGINE_STOP_REASONS = ("repetition_detected",)
MAX_STOP_TOKEN_ID = 2**31 - 1  # token IDs are int32
# vllm-<version>-<8 hex>, or the label of --fingerprint-mode custom (the ledger fingerprint ID)
SYSTEM_FINGERPRINT = re.compile(r"[A-Za-z0-9._:+-]{1,100}")
# the same, as sets (a v2 body is checked against them once per record read)
_CLEAR = frozenset(CLEAR)
_CLEAR_ALLOWED = _CLEAR | frozenset(OPTIONAL_CLEAR)
_SAMPLING = frozenset(SAMPLING)
_CHOICE_CLEAR = frozenset(CHOICE_CLEAR)


def sampling_of(request: Mapping[str, Any]) -> dict[str, Any]:
    """The request's SAMPLING members, as sent."""
    return {k: request[k] for k in SAMPLING if k in request}


def content_members(v1_body: Mapping[str, Any]) -> dict[str, Any]:
    """A v1 body's content, as disclosure member name -> value."""
    members: dict[str, Any] = {
        "request": v1_body["request"],
        "prompt_token_ids": v1_body["prompt_token_ids"],
    }
    if "request_raw" in v1_body:
        members["request_raw"] = v1_body["request_raw"]
    for choice in v1_body["choices"]:
        for name in CHOICE_CONTENT:
            if choice.get(name) is not None:
                members[f"choices[{choice['index']}].{name}"] = choice[name]
    return members


def commit_record(v1_body: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The v2 body of a validated v1 body, and its disclosures (fresh salts)."""
    digests, disclosures = commit(content_members(v1_body))
    body: dict[str, Any] = {
        k: v1_body[k] for k in CLEAR + OPTIONAL_CLEAR if k in v1_body and k != "choices"
    }
    body["schema_version"] = SCHEMA_VERSION
    body["sampling"] = sampling_of(v1_body["request"])
    body["choices"] = [{k: c[k] for k in CHOICE_CLEAR} for c in v1_body["choices"]]
    body[DIGESTS] = digests
    return body, disclosures


# Names ``--redact`` takes besides exact member names: groups of members.
REDACT_GROUPS: dict[str, tuple[str, ...]] = {
    "prompt": ("request", "request_raw", "prompt_token_ids"),
    "output": CHOICE_CONTENT,
    "token_ids": ("prompt_token_ids", "token_ids"),
    "text": ("text",),
    "logprobs": ("logprobs", "top_logprobs"),
}


# The content members a record can commit: what ``--redact`` may name one by one.
_CONTENT_MEMBER = re.compile(
    r"request|request_raw|prompt_token_ids"
    r"|choices\[(0|[1-9][0-9]{0,4})\]\.(token_ids|text|logprobs|top_logprobs)"
)
REDACT_MEMBERS = (
    "request",
    "request_raw",
    "prompt_token_ids",
    *(f"choices[N].{name}" for name in CHOICE_CONTENT),
)


def _redactable(name: str) -> bool:
    if name in REDACT_GROUPS or name in CHOICE_CONTENT:
        return True
    match = _CONTENT_MEMBER.fullmatch(name)
    return match is not None and (match[1] is None or int(match[1]) <= 10_000)


def check_redact(names: Sequence[str]) -> tuple[str, ...]:
    """Validate ``--redact`` names: content members (``choices[N].x`` with N 0-10000), a
    choice member of every choice (``text``, ``top_logprobs``, ...) or REDACT_GROUPS. A name
    no record can hold (``replay_output``, ``choices[0].margins``, ``choices[99999].text``)
    is refused, ``invalid_parameters`` naming the valid ones; a valid name that this record
    lacks (a choice it does not have, ``request_raw`` it did not keep) selects nothing."""
    bad = [n for n in names if not _redactable(n)]
    if bad:
        shown = ", ".join(n[:80] for n in bad)
        raise InvalidInput(
            f"cannot redact {shown}: name members (request, request_raw, prompt_token_ids, "
            "choices[N].token_ids, text, logprobs, top_logprobs, N 0-10000) or groups "
            f"({', '.join(sorted(REDACT_GROUPS))})",
            code="invalid_parameters",
            details={
                "field": "redact",
                "unknown": [n[:80] for n in bad],
                "members": list(REDACT_MEMBERS),
                "groups": sorted(REDACT_GROUPS),
            },
        )
    return tuple(names)


def is_redacted(member: str, names: Sequence[str]) -> bool:
    """Whether ``--redact names`` leaves ``member`` out (``text`` matches every choice's)."""
    leaf = member.rsplit(".", 1)[-1]
    for name in names:
        wanted = REDACT_GROUPS.get(name, (name,))
        if member in wanted or leaf in wanted:
            return True
    return False


def wire_item(envelope: bytes, disclosures: Sequence[str]) -> bytes:
    """One item of a ``{"records": [...]}`` batch, from a record's canonical envelope bytes
    and its disclosures: ``{"disclosures": [...], "envelope": ...}`` (as spools keep it)."""
    return b'{"disclosures":' + canonicalize(list(disclosures)) + b',"envelope":' + envelope + b"}"


def as_wire_item(item: bytes) -> bytes:
    """A spooled item as a batch item: a bare canonical envelope (a v1 record, spooled by an
    older collector) is wrapped with no disclosures."""
    return b'{"envelope":' + item + b"}" if item.startswith(b'{"body":') else item


def check_clear(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The v2-only members' shape (members, sampling, choices, digests); returns the digests.
    The members v1 shares are checked by ``ledger.records`` on the reassembled view."""
    missing = _CLEAR - body.keys()
    if missing:
        raise InvalidInput(f"record is missing {sorted(missing)}", code="schema_violation")
    extra = body.keys() - _CLEAR_ALLOWED
    if extra:
        raise InvalidInput(f"record has unknown members {sorted(extra)}", code="schema_violation")
    sampling = body["sampling"]
    if not isinstance(sampling, dict) or sampling.keys() - _SAMPLING:
        raise InvalidInput(
            f"sampling must be an object of {list(SAMPLING)}", code="schema_violation"
        )
    choices = body["choices"]
    if not isinstance(choices, list) or not choices:
        raise InvalidInput("choices must be a non-empty list", code="schema_violation")
    for i, c in enumerate(choices):
        if not isinstance(c, dict) or c.keys() != _CHOICE_CLEAR:
            raise InvalidInput(
                f"choices[{i}] must hold exactly {list(CHOICE_CLEAR)}",
                code="schema_violation",
                details={"field": f"choices[{i}]"},
            )
        index = c["index"]
        if type(index) is not int or not 0 <= index <= 10_000:
            raise InvalidInput(
                f"choices[{i}].index must be an integer in 0..10000", code="schema_violation"
            )
    if len({c["index"] for c in choices}) != len(choices):
        raise InvalidInput("choices have duplicate index values", code="schema_violation")
    return check_digests(body[DIGESTS])


def _clear_fail(message: str, field: str) -> InvalidInput:
    return InvalidInput(message, code="schema_violation", details={"field": field})


def check_clear_values(body: Mapping[str, Any]) -> None:
    """What a v2 body may hold in the clear, at ingest (InvalidInput ``schema_violation``,
    ``details.field``): nothing there is erased, so nothing there may be content.

    ``usage`` and ``timings`` hold only USAGE and TIMINGS members; ``system_fingerprint`` is
    null or 1-100 of ``A-Z a-z 0-9 . _ : + -``; each choice's ``finish_reason`` is null or
    one of FINISH_REASONS, its ``stop_reason`` null, a token ID (0 to 2**31 - 1), one of the
    stop strings of the clear ``sampling.stop`` (the request's, already in the clear) or one
    of ENGINE_STOP_REASONS. Call after :func:`check_clear` and ``records.check_common``
    (shape and types)."""
    for name, allowed in (("usage", USAGE), ("timings", TIMINGS)):
        value = body[name]
        if not isinstance(value, dict):
            raise _clear_fail(f"{name} must be an object", name)
        extra = sorted(value.keys() - set(allowed))
        if extra:
            raise _clear_fail(
                f"{name} has unknown members {[e[:40] for e in extra[:5]]}: a version 2 "
                f"record's {name} holds only {list(allowed)} (the clear is never erased)",
                name,
            )
    system = body["system_fingerprint"]
    if system is not None and not (
        isinstance(system, str) and SYSTEM_FINGERPRINT.fullmatch(system)
    ):
        raise _clear_fail(
            "system_fingerprint must be null or 1-100 characters of A-Z a-z 0-9 . _ : + - "
            "(vllm-<version>-<8 hex>, or the custom label)",
            "system_fingerprint",
        )
    _check_sampling_values(body["sampling"])
    stop = body["sampling"].get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    for i, c in enumerate(body["choices"]):
        finish = c["finish_reason"]
        if finish is not None and finish not in FINISH_REASONS:
            raise _clear_fail(
                f"choices[{i}].finish_reason must be null or one of {list(FINISH_REASONS)}",
                f"choices[{i}].finish_reason",
            )
        reason = c["stop_reason"]
        if reason is None or reason in ENGINE_STOP_REASONS:
            continue
        if type(reason) is int:
            if 0 <= reason <= MAX_STOP_TOKEN_ID:
                continue
        elif isinstance(reason, str) and any(reason == s for s in stops):
            continue
        raise _clear_fail(
            f"choices[{i}].stop_reason must be null, a token ID (0 to {MAX_STOP_TOKEN_ID}), "
            f"one of the request's stop strings (sampling.stop) or one of "
            f"{list(ENGINE_STOP_REASONS)}",
            f"choices[{i}].stop_reason",
        )


# A sampling value given as a string, as vLLM's request models (pydantic, lax) read one: a
# number ("0.5", " 7 ", "1e-3", "1_000", "inf") or a boolean word ("true", "on", "yes").
_NUMBER_TEXT = re.compile(
    r"\s*[+-]?(?:(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)\s*",
    re.IGNORECASE,
)
_BOOL_WORDS = frozenset(("true", "false", "yes", "no", "on", "off", "t", "f", "y", "n"))
_TEXT_MAX = 64


def _sampling_scalar(value: Any) -> bool:
    """A value of a number or boolean parameter, in a form vLLM may have accepted."""
    if value is None or type(value) in (bool, int, float):
        return True
    return (
        isinstance(value, str)
        and len(value) <= _TEXT_MAX
        and (_NUMBER_TEXT.fullmatch(value) is not None or value.strip().lower() in _BOOL_WORDS)
    )


def _check_sampling_values(sampling: Mapping[str, Any]) -> None:
    """Every sampling member but ``stop`` (the request's stop strings, in the clear by design)
    is a number or boolean parameter, so its value is one, or a list of them for
    ``stop_token_ids``: a value of any other shape is no sampling parameter vLLM takes, and
    would keep whatever it holds in the clear, where no erasure reaches."""
    for name, value in sampling.items():
        if name == "stop":
            continue
        ok = (
            isinstance(value, list) and all(map(_sampling_scalar, value))
            if name == "stop_token_ids"
            else _sampling_scalar(value)
        )
        if not ok:
            raise _clear_fail(
                f"sampling.{name} must be a number or a boolean (or a number or boolean word "
                f"of at most {_TEXT_MAX} characters, as vLLM reads one)"
                + (", or a list of them" if name == "stop_token_ids" else "")
                + ": the clear is never erased",
                f"sampling.{name}",
            )


def assemble(body: Mapping[str, Any], opened: Mapping[str, Disclosure]) -> dict[str, Any]:
    """The v1-shaped view of a v2 body and whatever of its content is ``opened``: content
    members that are not opened are simply absent."""
    view: dict[str, Any] = {k: v for k, v in body.items() if k not in (DIGESTS, "sampling")}
    for name in ("request", "request_raw", "prompt_token_ids"):
        if name in opened:
            view[name] = opened[name].value
    choices = []
    for c in body["choices"]:
        item = dict(c)
        for name in CHOICE_CONTENT:
            d = opened.get(f"choices[{c['index']}].{name}")
            if d is not None:
                item[name] = d.value
        choices.append(item)
    view["choices"] = choices
    return view


def open_record(
    body: Mapping[str, Any], disclosures: Sequence[object]
) -> tuple[dict[str, Disclosure], tuple[tuple[bytes, ...], ...]]:
    """Open every digest of a v2 body (ingest): its clear members hold no content
    (:func:`check_clear_values`), each disclosure must open a digest, every digest must be
    opened, the members must be exactly those a v1 body would hold (``request`` and
    ``prompt_token_ids``, each choice's ``token_ids``, no member of a choice that does not
    exist), and every salt is fresh (``ledger.disclosures.check_salts``). Returns the opened
    disclosures (member -> disclosure) and each one's salt keys, in the same order."""
    digests = check_clear(body)
    check_clear_values(body)
    opened = open_disclosures(digests, disclosures)
    if len(opened) != len(digests):
        raise VerificationError(
            f"{len(digests) - len(opened)} of the record's {len(digests)} digests are not "
            "opened: a record is ingested with all of its content",
            code="disclosures_missing",
            details={"check": "complete"},
        )
    indexes = {c["index"] for c in body["choices"]}
    need = set(REQUIRED_MEMBERS) | {f"choices[{i}].token_ids" for i in indexes}
    allowed = (
        need
        | {"request_raw"}
        | {f"choices[{i}].{name}" for i in indexes for name in CHOICE_CONTENT}
    )
    if not need <= set(opened) or not set(opened) <= allowed:
        raise InvalidInput(
            f"the disclosures must hold {sorted(need)} and only members of this record's "
            f"choices; got {sorted(opened)}",
            code="schema_violation",
        )
    salt_keys = check_salts(opened.values())
    request = opened["request"].value
    if not isinstance(request, dict) or canonicalize(sampling_of(request)) != canonicalize(
        body["sampling"]
    ):
        raise InvalidInput(
            "sampling must be exactly the SAMPLING members of the disclosed request",
            code="sampling_mismatch",
        )
    return opened, salt_keys
