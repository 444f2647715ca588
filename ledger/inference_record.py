"""One typed inference record, parsed once from either schema version.

:func:`parse_record` turns a signed record body (v1, ``ledger.records``; or v2,
``ledger.record_v2``, with whatever of its disclosures are at hand) into an
:class:`InferenceRecord`: named fields for everything in the clear, and the content that is
present. Ingest, audit, replay, cache keys and evidence read records through it, so none of
them digs into a body dict or cares which version it holds.

Content is **complete** for every v1 record and for a v2 record whose every digest is opened;
otherwise the missing members were erased (in the ledger) or redacted (in a bundle), and
:meth:`InferenceRecord.require_content` raises ``Gone`` (``content_erased``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from ledger.disclosures import Disclosure, open_disclosures
from ledger.errors import Gone, InvalidInput
from ledger.nesting import MAX_DEPTH, check_depth
from ledger.record_v2 import (
    CHOICE_CONTENT,
    DIGESTS,
    assemble,
    check_clear,
    open_record,
    sampling_of,
)
from ledger.record_v2 import SCHEMA_VERSION as V2
from ledger.records import (
    RecordSummary,
    check_common,
    check_content,
    check_version,
    validate_record_body,
)

CONTENT_MEMBERS_V1 = ("request", "request_raw", "prompt_token_ids")
_NOTHING_DISCLOSED: Mapping[str, Disclosure] = MappingProxyType({})


@dataclass(frozen=True)
class RecordChoice:
    """One choice: its clear members, and its content where present (packed as in v1)."""

    index: int
    finish_reason: str | None
    stop_reason: str | int | None
    token_ids: str | None = None
    text: str | None = None
    logprobs: str | None = None
    top_logprobs: dict[str, Any] | None = None


class InferenceRecord(NamedTuple):
    """A parsed record (immutable: a named tuple, because every record read or verified
    builds one, and a tuple builds in a fraction of a frozen dataclass's time)."""

    schema_version: int
    summary: RecordSummary
    sampling: Mapping[str, Any]
    usage: Mapping[str, Any]
    timings: Mapping[str, Any]
    system_fingerprint: str | None
    aborted: bool
    choices: tuple[RecordChoice, ...]
    # v2: the body's digests and the disclosures opened (member -> disclosure); v1: empty.
    digests: tuple[str, ...] = ()
    disclosed: Mapping[str, Disclosure] = _NOTHING_DISCLOSED
    request: dict[str, Any] | None = None
    request_raw: str | None = None
    prompt_token_ids: str | None = None
    # v2 parsed for ingest (complete): each disclosure's salt keys, in the order of disclosed.
    salt_keys: tuple[tuple[bytes, ...], ...] = ()

    @property
    def request_id(self) -> str:
        return self.summary.request_id

    @property
    def fingerprint_id(self) -> str:
        return self.summary.fingerprint_id

    @property
    def endpoint(self) -> str:
        return self.summary.endpoint

    @property
    def tier(self) -> int:
        return self.summary.tier

    @property
    def erasable(self) -> bool:
        """Whether the record's content lives outside its leaf (schema v2)."""
        return self.schema_version >= V2

    @property
    def complete(self) -> bool:
        return not self.erasable or len(self.disclosed) == len(self.digests)

    @property
    def missing_digests(self) -> tuple[str, ...]:
        opened = {d.digest for d in self.disclosed.values()}
        return tuple(d for d in self.digests if d not in opened)

    def require_content(self) -> None:
        """Raise Gone unless all of the record's content is present."""
        if not self.complete:
            raise Gone(
                f"the content of record {self.request_id!r} was erased",
                details={"request_id": self.request_id},
            )

    def content_view(self) -> dict[str, Any]:
        """The v1-shaped body (request, packed arrays, choices with content): what replay
        comparison and cache keys read. Gone unless the content is complete."""
        self.require_content()
        view: dict[str, Any] = {
            "endpoint": self.endpoint,
            "fingerprint_id": self.fingerprint_id,
            "request": self.request,
            "prompt_token_ids": self.prompt_token_ids,
            "choices": [
                {
                    k: v
                    for k, v in (
                        ("index", c.index),
                        ("finish_reason", c.finish_reason),
                        ("stop_reason", c.stop_reason),
                        ("token_ids", c.token_ids),
                        ("text", c.text),
                        ("logprobs", c.logprobs),
                        ("top_logprobs", c.top_logprobs),
                    )
                    if v is not None or k in ("finish_reason", "stop_reason")
                }
                for c in self.choices
            ],
        }
        if self.request_raw is not None:
            view["request_raw"] = self.request_raw
        return view


def _choices(view: Mapping[str, Any]) -> tuple[RecordChoice, ...]:
    return tuple(
        RecordChoice(
            index=c["index"],
            finish_reason=c["finish_reason"],
            stop_reason=c["stop_reason"],
            **{name: c.get(name) for name in CHOICE_CONTENT},
        )
        for c in view["choices"]
    )


def _build(
    body: Mapping[str, Any],
    view: Mapping[str, Any],
    summary: RecordSummary,
    sampling: Mapping[str, Any],
    digests: tuple[str, ...] = (),
    disclosed: Mapping[str, Disclosure] | None = None,
    salt_keys: tuple[tuple[bytes, ...], ...] = (),
) -> InferenceRecord:
    return InferenceRecord(
        schema_version=body["schema_version"],
        summary=summary,
        sampling=sampling,
        usage=body["usage"],
        timings=body["timings"],
        system_fingerprint=body["system_fingerprint"],
        aborted=body.get("aborted") is True,
        choices=_choices(view),
        digests=digests,
        disclosed=disclosed or _NOTHING_DISCLOSED,
        request=view.get("request"),
        request_raw=view.get("request_raw"),
        prompt_token_ids=view.get("prompt_token_ids"),
        salt_keys=salt_keys,
    )


def parse_record(
    body: Mapping[str, Any], disclosures: Sequence[object] = (), *, complete: bool = False
) -> InferenceRecord:
    """Parse a record body of either version (InvalidInput for a malformed body;
    VerificationError for a disclosure that does not open one of its digests).

    ``complete=True`` (ingest) requires all of a v2 record's content and checks it as v1
    content is checked; otherwise whatever disclosures are given are opened and the rest is
    reported missing.
    """
    b = dict(body)
    version = check_version(b, (1, V2))
    if version == 1:
        if disclosures:
            raise InvalidInput(
                "a schema version 1 record has no disclosures", code="schema_violation"
            )
        summary = validate_record_body(b)
        if complete:
            _check_depth(b)
        return _build(b, b, summary, sampling_of(b["request"]))
    digests = check_clear(b)
    summary = check_common(b)
    salt_keys: tuple[tuple[bytes, ...], ...] = ()
    if complete:
        opened, salt_keys = open_record(b, disclosures)
        view = assemble(b, opened)
        summary = check_content(view, summary)
        _check_depth(view)
    else:
        opened = open_disclosures(digests, disclosures)
        view = assemble(b, opened)
    return _build(b, view, summary, b["sampling"], digests, opened, salt_keys)


# How deep a record may nest, at ingest: a collector records no request nested deeper than 64
# levels (collectors/vllm_request.py), and every verifier (ledger verify, the browser's) reads
# a bundle of such a record well within its own limit, so what the ledger logs verifies alike
# everywhere. Records logged before the limit are read and verified as before.
MAX_RECORD_DEPTH = MAX_DEPTH


def as_logged(record: InferenceRecord, logged_body: Mapping[str, Any]) -> InferenceRecord:
    """``record`` (parsed from a body as sent, where types are checked strictly) with its
    free-form members as the logged bytes read back (``logged_body``: Envelope.body_read_back),
    which is what the audit derives rows from: the signed bytes write ``7.0`` and ``-0.0`` as
    ``7`` and ``0``, so rows derived from the body as sent could differ from the audit's.
    A v2 request is read from its disclosures, canonical bytes already."""
    if record.schema_version == 1:
        request = logged_body["request"]
        return record._replace(request=request, sampling=sampling_of(request))
    return record._replace(sampling=logged_body["sampling"])


def _check_depth(view: Mapping[str, Any]) -> None:
    """InvalidInput when a record's v1-shaped body nests deeper than MAX_RECORD_DEPTH."""
    check_depth(view, "record", MAX_RECORD_DEPTH)


def body_view(answer: Mapping[str, Any]) -> dict[str, Any]:
    """The v1-shaped body of a record as the API serves it (``{"envelope", "disclosures"?}``)
    or as a collector spools it: the signed body, with whatever content its disclosures hold
    put back in place (a v1 body is returned as it is). Disclosures are opened against the
    body's digests (VerificationError when one does not open)."""
    envelope = answer["envelope"]
    body = envelope["body"]
    if body.get("schema_version") != V2:
        return dict(body)
    opened = open_disclosures(check_clear(body), answer.get("disclosures") or ())
    return assemble(body, opened)


__all__ = [
    "DIGESTS",
    "InferenceRecord",
    "RecordChoice",
    "as_logged",
    "body_view",
    "parse_record",
]
