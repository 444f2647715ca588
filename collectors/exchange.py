"""One request/response exchange with the engine: what to ask, what to record, what to return.

Functions and small state over parsed JSON. The collector asks vLLM for more than the client
did (``return_token_ids``, the sampled tokens' logprobs and, where the client asked for top-k
alternatives, ``return_tokens_as_token_ids`` so the record keeps their token IDs), then hands
the client exactly what vLLM alone would have answered: every field it added is put back to
``null``, the value vLLM sends when that output was not requested, and ``token_id:N`` strings
are rendered back as vLLM renders tokens (:mod:`collectors.tokens`; checked against vLLM alone
in the tests), and an echoed prompt, which vLLM leaves out when asked for token IDs, is put
back. Every decision reads the client's fields as vLLM's request models do
(:mod:`collectors.vllm_request`). The same :class:`Accumulator` reads a whole response or a
stream of chunks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, cast

import orjson

from collectors.tokens import CONTEXT, TokenRenderer, parse_placeholder
from collectors.vllm_request import Judged, Unsure, judge, prompt_kind, recordable
from ledger.compact_json import compact_json
from ledger.errors import InvalidInput
from ledger.records import MAX_TOP_K, Choice

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Plan:
    """The request for the engine, and the fields to null in what the client gets back."""

    endpoint: str
    engine_body: dict[str, Any]
    hide_token_ids: bool
    hide_logprobs: bool
    # Alternatives per position whose token IDs the record keeps (0: none).
    top_k: int = 0
    # The engine sends ``token_id:N`` token strings that the client did not ask for.
    render_tokens: bool = False
    # Whether vLLM streams the answer (the client's ``stream`` as vLLM reads it).
    stream: bool = False
    # The prompt vLLM echoes before each choice's text, which it leaves out when asked for
    # token IDs (None: nothing to put back).
    echo_text: str | None = None
    # The engine body as a record holds it (big integers as strings).
    recorded_body: dict[str, Any] = field(default_factory=dict)

    @property
    def reshapes(self) -> bool:
        """Whether the client's view differs from the engine's answer."""
        return (
            self.hide_token_ids
            or self.hide_logprobs
            or self.render_tokens
            or self.echo_text is not None
        )


def requested_top_k(endpoint: str, judged: Judged) -> int:
    """The alternatives per output position the client asked for (0: none)."""
    chat_k = judged.top_logprobs if judged.logprobs else 0
    k = chat_k if endpoint == CHAT else judged.logprobs
    return k if k is not None and 0 < k <= MAX_TOP_K else 0


def _ids_recordable(judged: Judged) -> bool:
    """Output-only logprobs: no echoed prompt, prompt logprobs or fixed-ID scores among them."""
    return not (judged.echo or judged.prompt_logprobs is not None or judged.logprob_token_ids)


def plan(endpoint: str, body: dict[str, Any], *, can_render: bool = False) -> Plan:
    """Add what the record needs to ``body`` (a copy) and note what the client did not ask.

    Decisions follow the client's fields as vLLM reads them (:mod:`collectors.vllm_request`);
    a request the collector cannot read as vLLM would, or whose meaning its additions would
    change, raises :class:`Unsure` (the caller forwards it unchanged). ``can_render``: the
    collector can render tokens exactly as vLLM does (a
    :class:`~collectors.tokens.TokenRenderer` for the model), so it may ask for token IDs in
    place of token strings to record the top-k alternatives' IDs.
    """
    judged = judge(endpoint == CHAT, body)
    echo_text = None
    if endpoint == COMPLETIONS:
        if prompt_kind(body) == "several":
            raise InvalidInput(
                "the recording collector takes one prompt per request (a string or a list of "
                "token IDs): send several prompts as several requests",
                code="one_prompt_per_request",
            )
        if judged.echo and not judged.return_token_ids:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise Unsure("echo of a token-ID prompt: vLLM echoes text it decodes itself")
            echo_text = prompt
    engine = dict(body)
    hide_ids = not judged.return_token_ids
    engine["return_token_ids"] = True
    if endpoint == CHAT:
        hide_logprobs = not judged.logprobs
        # vLLM refuses top-k or chosen tokens' logprobs without ``logprobs: true``: such a
        # request goes to the engine as it came, and the client gets vLLM's own error.
        refused = judged.top_logprobs not in (None, 0) or judged.logprob_token_ids
        if hide_logprobs and not refused:
            engine["logprobs"] = True
            engine["top_logprobs"] = 0
    else:
        hide_logprobs = judged.logprobs is None
        if hide_logprobs and judged.logprob_token_ids:
            # vLLM refuses these without logprobs: adding logprobs would make it valid.
            raise Unsure("logprobs would change what vLLM makes of the request")
        # With echo, logprobs would make vLLM compute (and return) prompt logprobs.
        if hide_logprobs and not judged.echo:
            engine["logprobs"] = 0
    top_k = requested_top_k(endpoint, judged) if _ids_recordable(judged) else 0
    render = False
    if top_k and not judged.return_tokens_as_token_ids:
        if can_render:
            engine["return_tokens_as_token_ids"] = True
            render = True
        else:
            top_k = 0
    return Plan(
        endpoint,
        engine,
        hide_ids,
        hide_logprobs,
        top_k,
        render,
        stream=judged.stream,
        echo_text=echo_text,
        recorded_body=recordable(engine),
    )


class ClientView:
    """Turns the engine's responses or chunks into what vLLM would have sent the client.

    Stateful across a stream's chunks: rendering a token needs the choice's preceding sampled
    tokens, and completions' ``text_offset`` runs on from chunk to chunk.
    """

    def __init__(self, plan: Plan, renderer: TokenRenderer | None = None) -> None:
        if plan.render_tokens and renderer is None:
            raise ValueError("a plan that renders tokens needs a TokenRenderer")
        self.plan = plan
        self._renderer = renderer
        self._context: dict[int, list[int]] = {}
        self._offset: dict[int, int] = {}
        self._echoed: set[int] = set()
        # Sampled chat tokens whose rendering differed from the exact string vLLM sent in
        # ``bytes`` (the exact one is used; a count above 0 means the renderer is off).
        self.mismatches = 0

    def shape(self, data: dict[str, Any]) -> dict[str, Any]:
        plan = self.plan
        if not plan.reshapes:
            return data
        out = dict(data)
        if plan.hide_token_ids and out.get("prompt_token_ids") is not None:
            out["prompt_token_ids"] = None
        choices = []
        for choice in out.get("choices") or []:
            c = dict(choice)
            if plan.hide_logprobs and c.get("logprobs") is not None:
                c["logprobs"] = None
            elif plan.render_tokens and isinstance(c.get("logprobs"), dict):
                c["logprobs"] = self._render(int(c.get("index", 0)), c["logprobs"])
            index = c.get("index", 0)
            echoed = plan.echo_text is not None and index not in self._echoed
            if plan.hide_token_ids:
                # A stream's echoing chunk carries the prompt's IDs in vLLM alone too.
                keep = ("prompt_token_ids",) if echoed and plan.stream else ()
                for key in ("token_ids", "prompt_token_ids"):
                    if c.get(key) is not None and key not in keep:
                        c[key] = None
            if echoed:
                # vLLM echoes the prompt in a choice's first text (its first chunk).
                self._echoed.add(index)
                if isinstance(c.get("text"), str):
                    c["text"] = f"{plan.echo_text}{c['text']}"
            choices.append(c)
        if "choices" in out:
            out["choices"] = choices
        return out

    def _piece(self, token: Any, context: list[int]) -> Any:
        token_id = parse_placeholder(token)
        if token_id is None or self._renderer is None:
            return token
        return self._renderer.piece(token_id, context)

    def _render(self, index: int, logprobs: dict[str, Any]) -> dict[str, Any]:
        context = self._context.setdefault(index, [])
        if self.plan.endpoint == CHAT:
            return self._render_chat(logprobs, context)
        tokens = logprobs.get("tokens")
        if not isinstance(tokens, list):
            return logprobs
        offset = self._offset.get(index, 0)
        rows = logprobs.get("top_logprobs") or [None] * len(tokens)
        values = logprobs.get("token_logprobs") or [0.0] * len(tokens)
        out_tokens, out_rows, offsets = [], [], []
        piece = self._piece
        for token, row, value in zip(tokens, rows, values, strict=False):
            token_id = parse_placeholder(token)
            if token_id is not None and value is None:
                text = self._plain(token_id)  # no logprob for the position: a plain decode
            else:
                text = piece(token, context)
            out_tokens.append(text)
            out_rows.append(
                {piece(key, context): value for key, value in row.items()}
                if isinstance(row, dict)
                else row
            )
            offsets.append(offset)
            offset += len(text) if isinstance(text, str) else 0
            self._advance(context, token_id)
        self._offset[index] = offset
        return {
            **logprobs,
            "text_offset": offsets,
            "tokens": out_tokens,
            "top_logprobs": out_rows if logprobs.get("top_logprobs") is not None else None,
        }

    def _render_chat(self, logprobs: dict[str, Any], context: list[int]) -> dict[str, Any]:
        """Chat logprobs with their tokens rendered, in place (every chunk's logprobs are
        rendered once, after the accumulator read them): the members keep their order, and
        a token's UTF-8 ``bytes`` are a shared tuple per text, which JSON writes as a list."""
        content = logprobs.get("content")
        if not isinstance(content, list):
            return logprobs
        renderer = self._renderer
        for item in content:
            token = item.get("token")
            token_id = parse_placeholder(token)
            if token_id is None or renderer is None:
                text = token
            else:
                text = renderer.piece(token_id, context)
            exact = item.get("bytes")
            if token_id is not None and isinstance(exact, list):
                # vLLM fills a sampled token's bytes from its real string, even in ID mode...
                sent = bytes(exact).decode("utf-8", errors="replace")
                if parse_placeholder(sent) == token_id:
                    # ...except where it had no logprob for the position: a plain decode.
                    text = self._plain(token_id)
                    item["bytes"] = _utf8(text)
                elif sent != text:
                    self.mismatches += 1
                    text = sent
            top = item.get("top_logprobs")
            if top is not None:
                for alt in top or ():
                    alt_token = alt.get("token")
                    alt_id = parse_placeholder(alt_token)
                    if alt_id is not None and alt_id == token_id:
                        alt_text = text
                    elif alt_id is None or renderer is None:
                        alt_text = alt_token
                    else:
                        alt_text = renderer.piece(alt_id, context)
                    alt["token"] = alt_text
                    alt["bytes"] = (
                        _utf8(alt_text) if isinstance(alt_text, str) else alt.get("bytes")
                    )
            item["token"] = text
            self._advance(context, token_id)
        return logprobs

    def _plain(self, token_id: int) -> str:
        assert self._renderer is not None
        return self._renderer.decode([token_id])

    @staticmethod
    def _advance(context: list[int], token_id: int | None) -> None:
        if token_id is not None:
            context.append(token_id)
            del context[:-CONTEXT]


dumps = compact_json


@lru_cache(maxsize=65536)
def _utf8(text: str) -> tuple[int, ...]:
    """A token's UTF-8 bytes as vLLM lists them (encoded once per token text)."""
    return tuple(text.encode("utf-8", errors="replace"))


def engine_json(data: bytes | str) -> Any:
    """An engine's answer (or streamed chunk) parsed: orjson, which reads every float to the
    same bits as ``json.loads`` and is about four times faster on a chunk, or, for what orjson
    refuses (an integer beyond 64 bits, NaN), ``json.loads``. ValueError if neither reads it,
    bytes that are not UTF-8 included."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # bytes that are not UTF-8 raise UnicodeDecodeError
        return json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)


_FLOAT = {float}


def _descending(entry: tuple[Any, float]) -> float:
    return -entry[1]


@dataclass
class _ChoiceState:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    logprobs_complete: bool = True
    margins: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    top_complete: bool = True
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass
class Accumulator:
    """What the engine produced, gathered from a response or from stream chunks."""

    endpoint: str
    # Alternatives per position to keep with their token IDs (the plan's ``top_k``; 0: none).
    top_k: int = 0
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
            state = self.choices.get(index)
            if state is None:  # not setdefault: that would build a state for every chunk
                state = self.choices[index] = _ChoiceState()
            if isinstance(choice.get("prompt_token_ids"), list):
                self.prompt_token_ids = choice["prompt_token_ids"]
            ids = choice.get("token_ids") or []
            state.token_ids.extend(map(int, ids))
            produced = produced or bool(ids)
            fast = self._fast_positions(choice.get("logprobs"), len(ids))
            if fast is not None:
                state.logprobs.extend(fast[0])
                state.margins.extend(fast[1])
                state.top_ids.extend(fast[2])
                state.top_logprobs.extend(fast[3])
                self._feed_text(state, choice)
                continue
            values = self._logprobs(choice.get("logprobs"), len(ids))
            if values is None:
                if ids:
                    state.logprobs_complete = False
            else:
                state.logprobs.extend(values)
            state.margins.extend(self._margins(choice.get("logprobs"), len(ids)))
            if self.top_k and ids:
                rows = self._alternatives(choice.get("logprobs"), len(ids))
                if rows is None:
                    state.top_complete = False
                else:
                    for row in rows:
                        state.top_ids.append([token_id for token_id, _ in row])
                        state.top_logprobs.append([value for _, value in row])
            self._feed_text(state, choice)
        self.first_token_seen = self.first_token_seen or produced
        return produced

    def _feed_text(self, state: _ChoiceState, choice: dict[str, Any]) -> None:
        text = self._text(choice)
        if text:
            state.text.append(text)
        if choice.get("finish_reason") is not None:
            state.finish_reason = choice["finish_reason"]
        if choice.get("stop_reason") is not None:
            state.stop_reason = choice["stop_reason"]

    def _fast_positions(
        self, logprobs: Any, count: int
    ) -> tuple[list[float], list[float], list[list[int]], list[list[float]]] | None:
        """A choice's logprobs, margins and top-k alternatives (IDs, values) read in one pass,
        for the common shape only: one logprob per output token and one row of at least two
        alternatives each, every value a float and, with ``top_k``, every alternative kept a
        ``token_id:N``. There the general readers below (``_logprobs``, ``_margins``,
        ``_alternatives``) would give the very same values; for anything else (None) they
        run instead."""
        if count == 0 or not isinstance(logprobs, dict):
            return None
        values: Any
        # per position: the alternatives' token strings and their values (None: no row)
        rows: list[tuple[list[Any], list[Any]] | None]
        if self.endpoint == CHAT:
            content = logprobs.get("content")
            if not isinstance(content, list) or len(content) != count:
                return None
            values = [item.get("logprob") for item in content]
            rows = []
            for item in content:
                top = item.get("top_logprobs") or ()
                rows.append(
                    ([alt.get("token") for alt in top], [alt.get("logprob") for alt in top])
                )
        else:
            values = logprobs.get("token_logprobs")
            top = logprobs.get("top_logprobs")
            if not isinstance(values, list) or not isinstance(top, list):
                return None
            if len(values) != count or len(top) != count:
                return None  # with echo, the prompt's positions come first
            rows = [
                (list(row), list(row.values())) if isinstance(row, dict) else None for row in top
            ]
        top_k = self.top_k
        chat = self.endpoint == CHAT
        margins: list[float] = []
        top_ids: list[list[int]] = []
        top_values: list[list[float]] = []
        for value, row in zip(values, rows, strict=True):
            if type(value) is not float or row is None:
                return None
            tokens, alt_values = row
            if len(alt_values) < 2 or set(map(type, alt_values)) != _FLOAT:
                return None
            ranked = sorted(alt_values, reverse=True)  # stable, as the sort below
            margins.append(ranked[0] - ranked[1])
            if not top_k:
                continue
            if len(alt_values) == top_k + 1 and not chat:
                # completions list the sampled token first when it is outside the top-k
                tokens, alt_values = tokens[1:], alt_values[1:]
                ranked = sorted(alt_values, reverse=True)
            if len(alt_values) != top_k:
                return None
            parsed_ids = list(map(parse_placeholder, tokens))
            if None in parsed_ids:
                return None
            ids = cast(list[int], parsed_ids)
            if alt_values == ranked:  # already highest first (the engine's rank order)
                top_ids.append(ids)
                top_values.append(alt_values)
                continue
            parsed = list(zip(ids, alt_values, strict=True))
            parsed.sort(key=_descending)  # stable: the engine's order kept among equals
            top_ids.append([token_id for token_id, _ in parsed])
            top_values.append([alt_value for _, alt_value in parsed])
        return values, margins, top_ids, top_values

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

    def _alternatives(self, logprobs: Any, count: int) -> list[list[tuple[int, float]]] | None:
        """Per position, the top-k alternatives as (token ID, logprob), highest first.

        Rows come as vLLM builds them: the sampled token first, then the top-k in rank order,
        the sampled one not repeated. Completions show all of them (k + 1 entries when the
        sampled token is outside the top-k, which is then dropped here); chat shows the first
        k. Entries are ordered by logprob, descending, the engine's order kept among equals.
        """
        if not isinstance(logprobs, dict):
            return None
        if self.endpoint == CHAT:
            raw_rows = [
                [(t.get("token"), t.get("logprob")) for t in item.get("top_logprobs") or []]
                for item in logprobs.get("content") or []
            ]
        else:
            raw_rows = [
                list(row.items()) if isinstance(row, dict) else []
                for row in logprobs.get("top_logprobs") or []
            ]
        if len(raw_rows) != count:
            return None
        rows = []
        for raw in raw_rows:
            if len(raw) == self.top_k + 1 and self.endpoint != CHAT:
                raw = raw[1:]
            if len(raw) != self.top_k:
                return None
            row = []
            for token, value in raw:
                token_id = parse_placeholder(token)
                numeric = isinstance(value, int | float) and not isinstance(value, bool)
                if token_id is None or not numeric:
                    return None
                row.append((token_id, float(value)))
            row.sort(key=lambda entry: -entry[1])
            rows.append(row)
        return rows

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
        choices = []
        for _, state in sorted(self.choices.items()):
            n = len(state.token_ids)
            top = state.top_complete and n > 0 and len(state.top_ids) == n
            choices.append(
                Choice(
                    token_ids=state.token_ids,
                    logprobs=state.logprobs
                    if state.logprobs_complete and len(state.logprobs) == n
                    else None,
                    top_k_ids=state.top_ids if top else None,
                    top_k_logprobs=state.top_logprobs if top else None,
                    finish_reason=state.finish_reason,
                    stop_reason=state.stop_reason,
                    text="".join(state.text),
                )
            )
        return choices
