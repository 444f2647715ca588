"""What the console's pages show, built from records, verdicts and fingerprints as logged.

Pure functions from core objects to plain dicts the templates render; no request, no
database. Every value comes from a logged envelope (or a disclosure it commits to): the page
is a reading of the log, and the record page's in-browser check proves the same facts from
the evidence bundle.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ledger.errors import LedgerError
from ledger.fingerprint_diff import diff as fingerprint_diff
from ledger.fingerprint_diff import member_path
from ledger.fingerprint_facts import FingerprintFacts
from ledger.inference_record import InferenceRecord, RecordChoice
from ledger.packing import unpack_float32, unpack_int32
from ledger.storage.queries import StoredRecord
from ledger.storage.record_search import Hit

PREVIEW_CHARS = 80


def prompt_text(request: Mapping[str, Any] | None) -> str | None:
    """The prompt as a person reads it: a completions prompt, or chat messages as
    ``role: content`` lines; None when the request is not disclosed."""
    if request is None:
        return None
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return json.dumps(prompt)  # token IDs or a batch: shown as sent
    messages = request.get("messages") or []
    if not isinstance(messages, list) or prompt is not None:
        return json.dumps(request)  # a signed request may hold anything: shown as sent
    lines = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts: their text
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        lines.append(f"{message.get('role', '?')}: {content if content is not None else ''}")
    return "\n".join(lines)


def preview(hit: Hit) -> str | None:
    """The first words of a record's prompt when it is disclosed (None: erased or absent)."""
    try:
        text = prompt_text(hit.record.record.request)
    except LedgerError:
        return None
    if text is None:
        return None
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "\u2026"


def search_row(hit: Hit) -> dict[str, Any]:
    r = hit.record
    return {
        "request_id": r.request_id,
        "received_at": r.received_at.strftime("%Y-%m-%d %H:%M:%SZ"),
        "model": r.model,
        "pool": r.pool,
        "worker_id": r.worker_id,
        "tier": r.tier,
        "aborted": r.aborted,
        "content": r.content,
        "held_by": hit.held_by,
        "verdict": hit.verdict,
        "preview": preview(hit),
    }


def probability_class(logprob: float) -> str:
    """A colour band for a token's probability (the page's legend names the bands). A logprob
    is at most 0; a signer's larger one (even 1000, whose exp overflows) is in the top band."""
    p = math.exp(min(logprob, 0.0))
    if p >= 0.9:
        return "p1"
    if p >= 0.5:
        return "p2"
    if p >= 0.2:
        return "p3"
    return "p4"


def _tokens(choice: RecordChoice, diverge_at: int | None) -> list[dict[str, Any]]:
    ids = unpack_int32(choice.token_ids, "token_ids") if choice.token_ids else []
    lps = unpack_float32(choice.logprobs, "logprobs") if choice.logprobs else []
    top_ids: list[int] = []
    top_lps: list[float] = []
    k = 0
    if choice.top_logprobs:
        k = int(choice.top_logprobs["k"])
        top_ids = unpack_int32(choice.top_logprobs["token_ids"], "top_logprobs.token_ids")
        top_lps = unpack_float32(choice.top_logprobs["logprobs"], "top_logprobs.logprobs")
    out = []
    for pos, token in enumerate(ids):
        lp = lps[pos] if pos < len(lps) else None
        alternatives = [
            {"id": top_ids[i], "logprob": f"{top_lps[i]:.4f}"}
            for i in range(pos * k, min((pos + 1) * k, len(top_ids)))
        ]
        out.append(
            {
                "pos": pos,
                "id": token,
                "logprob": None if lp is None else f"{lp:.4f}",
                "band": "p0" if lp is None else probability_class(lp),
                "alternatives": alternatives,
                "diverges": pos == diverge_at,
            }
        )
    return out


def divergences(verdict_bodies: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per choice index, the first divergence the latest diverging verdict found."""
    found: dict[int, dict[str, Any]] = {}
    for body in verdict_bodies:
        comparison = body.get("comparison")
        if not isinstance(comparison, Mapping):
            continue
        for c in comparison.get("choices") or []:
            if isinstance(c, Mapping) and isinstance(c.get("first_divergence"), int):
                found[int(c.get("index", 0))] = {
                    "position": c["first_divergence"],
                    "margin": c.get("top2_margin_at_divergence"),
                    "replay_id": body.get("replay_id"),
                }
    return found


def record_page(
    stored: StoredRecord,
    hit: Hit,
    verdict_bodies: Sequence[Mapping[str, Any]],
    erasure: Mapping[str, Any] | None,
) -> dict[str, Any]:
    record: InferenceRecord = stored.record
    diverge = divergences(verdict_bodies)
    choices = []
    for choice in record.choices:
        at = diverge.get(choice.index)
        choices.append(
            {
                "index": choice.index,
                "finish_reason": choice.finish_reason,
                "stop_reason": choice.stop_reason,
                "text": choice.text,
                "tokens": _tokens(choice, at["position"] if at else None),
                "divergence": at,
            }
        )
    members = []
    opened = {d.digest: d for d in record.disclosed.values()}
    erased = set(erasure.get("erased_digests") or ()) if erasure else set()
    for digest in record.digests:
        d = opened.get(digest)
        members.append(
            {
                "digest": digest,
                "member": d.member if d else None,
                "state": "disclosed" if d else ("erased" if digest in erased else "missing"),
                "held": hit.held_by is not None,
            }
        )
    return {
        "meta": search_row(hit),
        "log_index": stored.log_index,
        "content_hash": stored.content_hash,
        "fingerprint_id": stored.fingerprint_id,
        "key_id": stored.key_id,
        "endpoint": stored.endpoint,
        "schema_version": record.schema_version,
        "sampling": dict(record.sampling),
        "usage": dict(record.usage),
        "timings": dict(record.timings),
        "system_fingerprint": record.system_fingerprint,
        "prompt": prompt_text(record.request),
        "prompt_tokens": (
            unpack_int32(record.prompt_token_ids, "prompt_token_ids")
            if record.prompt_token_ids
            else []
        ),
        "choices": choices,
        "members": members,
        "erasure": dict(erasure) if erasure else None,
        "verdicts": [
            {
                "replay_id": b.get("replay_id"),
                "verdict": b.get("verdict"),
                "pool": b.get("pool"),
                "worker_id": b.get("worker_id"),
                "reason": b.get("reason"),
                "replayed_at": b.get("replayed_at"),
            }
            for b in verdict_bodies
        ],
    }


def _groups(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A fingerprint body as groups of dotted-path rows, one group per top-level member."""
    groups = []
    for name, value in body.items():
        rows: list[tuple[str, str]] = []
        _flatten(member_path("", name), value, rows)
        groups.append({"name": name, "rows": rows})
    return groups


def _flatten(path: str, value: Any, rows: list[tuple[str, str]]) -> None:
    if isinstance(value, Mapping) and value:
        for k, v in value.items():
            _flatten(member_path(path, k), v, rows)
    elif isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
        for i, v in enumerate(value):
            _flatten(f"{path}[{i}]", v, rows)
    else:
        rows.append((path, _plain(value) if isinstance(value, str) else json.dumps(value)))


def _plain(text: str) -> str:
    """A signed value as shown: as it is when every character is printable (none of the
    categories Other or Separator but " ") and it does not begin with a quote, else as a JSON
    string (``"strict\\u200b"``), so that two values that look alike on the page are alike."""
    if text.isprintable() and not text.startswith('"'):
        return text
    return json.dumps(text)


def fingerprint_page(facts: FingerprintFacts, body: Mapping[str, Any]) -> dict[str, Any]:
    return {"facts": facts.to_dict(), "groups": _groups(body)}


def diff_page(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [d.to_json() for d in fingerprint_diff(dict(a), dict(b))]


def certificate_matrix(body: Mapping[str, Any]) -> dict[str, Any]:
    """A certificate's cells as a concurrency x max_tokens matrix of bitwise rates."""
    cells = [c for c in body.get("results") or [] if isinstance(c, Mapping)]
    lengths = sorted({c.get("max_tokens") for c in cells if isinstance(c.get("max_tokens"), int)})
    conc = sorted({c.get("concurrency") for c in cells if isinstance(c.get("concurrency"), int)})
    by = {(c.get("concurrency"), c.get("max_tokens")): c for c in cells}
    rows = []
    for c in conc:
        row = []
        for n in lengths:
            cell = by.get((c, n))
            rate = cell.get("bitwise_rate") if cell else None
            row.append(
                {
                    "rate": None if not isinstance(rate, (int, float)) else float(rate),
                    "shown": "" if not isinstance(rate, (int, float)) else f"{rate:.0%}",
                    "requests": cell.get("requests") if cell else None,
                    "band": _rate_band(rate),
                }
            )
        rows.append({"concurrency": c, "cells": row})
    return {"lengths": lengths, "rows": rows}


def _rate_band(rate: object) -> str:
    if not isinstance(rate, (int, float)):
        return "r0"
    if rate >= 1.0:
        return "r1"
    if rate >= 0.9:
        return "r2"
    if rate >= 0.5:
        return "r3"
    return "r4"
