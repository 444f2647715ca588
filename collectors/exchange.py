"""One request/response exchange with the engine: what to ask, what to record, what to return.

Pure functions over parsed JSON. The collector asks vLLM for more than the client did
(``return_token_ids`` and the sampled tokens' logprobs), then hands the client exactly what
vLLM alone would have answered: every field it added is put back to ``null``, the value vLLM
sends when that output was not requested (checked against vLLM alone in the tests). The same
:class:`Accumulator` reads a whole response or a stream of chunks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ledger.errors import InvalidInput
from ledger.records import Choice

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Plan:
    """The request for the engine, and the fields to null in what the client gets back."""

    endpoint: str
    engine_body: dict[str, Any]
    hide_token_ids: bool
    hide_logprobs: bool

    @property
    def stream(self) -> bool:
        return bool(self.engine_body.get("stream"))


def plan(endpoint: str, body: dict[str, Any]) -> Plan:
    """Add what the record needs to ``body`` (a copy) and note what the client did not ask."""
    if endpoint == COMPLETIONS:
        prompt = body.get("prompt")
        single = isinstance(prompt, str) or (
            isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        )
        if not single:
            raise InvalidInput(
                "the recording collector takes one prompt per request (a string or a list of "
                "token IDs): send several prompts as several requests",
                code="one_prompt_per_request",
            )
    engine = dict(body)
    hide_ids = not body.get("return_token_ids")
    engine["return_token_ids"] = True
    if endpoint == CHAT:
        hide_logprobs = not body.get("logprobs")
        if hide_logprobs:
            engine["logprobs"] = True
            engine["top_logprobs"] = 0
    else:
        hide_logprobs = body.get("logprobs") is None
        if hide_logprobs:
            engine["logprobs"] = 0
    return Plan(endpoint, engine, hide_ids, hide_logprobs)


def for_client(plan: Plan, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a response or a chunk) as vLLM would have sent it for the client's request."""
    if not (plan.hide_token_ids or plan.hide_logprobs):
        return data
    out = dict(data)
    if plan.hide_token_ids and out.get("prompt_token_ids") is not None:
        out["prompt_token_ids"] = None
    choices = []
    for choice in out.get("choices") or []:
        c = dict(choice)
        if plan.hide_token_ids:
            for key in ("token_ids", "prompt_token_ids"):
                if c.get(key) is not None:
                    c[key] = None
        if plan.hide_logprobs and c.get("logprobs") is not None:
            c["logprobs"] = None
        choices.append(c)
    if "choices" in out:
        out["choices"] = choices
    return out


def dumps(data: dict[str, Any]) -> bytes:
    """Compact JSON with raw UTF-8, as vLLM writes it."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


@dataclass
class _ChoiceState:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    logprobs_complete: bool = True
    margins: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass
class Accumulator:
    """What the engine produced, gathered from a response or from stream chunks."""

    endpoint: str
    prompt_token_ids: list[int] | None = None
    system_fingerprint: str | None = None
    model: str | None = None
    choices: dict[int, _ChoiceState] = field(default_factory=dict)
    first_token_seen: bool = False

    def feed(self, data: dict[str, Any]) -> bool:
        """Take one response or chunk; True when it carried output tokens."""
        self.model = data.get("model") or self.model
        if data.get("system_fingerprint"):
            self.system_fingerprint = data["system_fingerprint"]
        if isinstance(data.get("prompt_token_ids"), list):
            self.prompt_token_ids = data["prompt_token_ids"]
        produced = False
        for choice in data.get("choices") or []:
            index = int(choice.get("index", 0))
            state = self.choices.setdefault(index, _ChoiceState())
            if isinstance(choice.get("prompt_token_ids"), list):
                self.prompt_token_ids = choice["prompt_token_ids"]
            ids = choice.get("token_ids") or []
            state.token_ids.extend(int(t) for t in ids)
            produced = produced or bool(ids)
            values = self._logprobs(choice.get("logprobs"), len(ids))
            if values is None:
                if ids:
                    state.logprobs_complete = False
            else:
                state.logprobs.extend(values)
            state.margins.extend(self._margins(choice.get("logprobs"), len(ids)))
            text = self._text(choice)
            if text:
                state.text.append(text)
            if choice.get("finish_reason") is not None:
                state.finish_reason = choice["finish_reason"]
            if choice.get("stop_reason") is not None:
                state.stop_reason = choice["stop_reason"]
        self.first_token_seen = self.first_token_seen or produced
        return produced

    def _logprobs(self, logprobs: Any, count: int) -> list[float] | None:
        if count == 0:
            return []
        if not isinstance(logprobs, dict):
            return None
        if self.endpoint == CHAT:
            content = logprobs.get("content") or []
            values = [item.get("logprob") for item in content]
        else:
            values = logprobs.get("token_logprobs") or []
        values = values[-count:]  # with echo, prompt logprobs come first
        if len(values) != count or any(not isinstance(v, int | float) for v in values):
            return None
        return [float(v) for v in values]

    def _margins(self, logprobs: Any, count: int) -> list[float]:
        """Top-1 minus top-2 logprob per position, where the engine sent two alternatives."""
        if count == 0 or not isinstance(logprobs, dict):
            return []
        if self.endpoint == CHAT:
            rows = [
                [t.get("logprob") for t in (item.get("top_logprobs") or [])]
                for item in logprobs.get("content") or []
            ]
        else:
            rows = [list((row or {}).values()) for row in logprobs.get("top_logprobs") or []]
        margins = []
        for row in rows[-count:]:
            values = sorted((v for v in row if isinstance(v, int | float)), reverse=True)
            if len(values) < 2:
                return []
            margins.append(float(values[0] - values[1]))
        return margins

    def margins(self) -> list[list[float] | None]:
        """Per choice, the margins when every output position has them (else None)."""
        return [
            state.margins if state.margins and len(state.margins) == len(state.token_ids) else None
            for _, state in sorted(self.choices.items())
        ]

    def _text(self, choice: dict[str, Any]) -> str:
        if self.endpoint == CHAT:
            holder = choice.get("message") or choice.get("delta") or {}
            content = holder.get("content")
            return content if isinstance(content, str) else ""
        text = choice.get("text")
        return text if isinstance(text, str) else ""

    def record_choices(self) -> list[Choice]:
        return [
            Choice(
                token_ids=state.token_ids,
                logprobs=state.logprobs
                if state.logprobs_complete and len(state.logprobs) == len(state.token_ids)
                else None,
                finish_reason=state.finish_reason,
                stop_reason=state.stop_reason,
                text="".join(state.text),
            )
            for _, state in sorted(self.choices.items())
        ]
