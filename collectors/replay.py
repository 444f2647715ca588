"""The collector's replay endpoint: run a ledger-signed order once, unrecorded, sign the output.

``POST /ledger/v1/replay`` takes a replay order envelope signed by the ledger's log key (the
collector learns that key from the ledger at start, or has it pinned), addressed to this worker
and recent. It sends the order's exact request bytes to the engine (streaming or not, as
recorded), gathers the tokens and logprobs with the same code that makes records, and answers
a replay output envelope signed with the collector key. Nothing is spooled: a replay is not
traffic. Without a valid order the answer is 403 and the engine is never called.
"""

from __future__ import annotations

import binascii
import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from collectors.errors import error_response
from collectors.exchange import Accumulator
from collectors.upstream import Upstream
from collectors.worker_state import WorkerState, unsure
from ledger.clock import utc_now
from ledger.errors import (
    InvalidInput,
    LedgerError,
    Unreachable,
    VerificationError,
)
from ledger.replay import (
    ORDER_KIND,
    ORDER_MAX_AGE,
    OUTPUT_KIND,
    ReplayedChoice,
    build_output,
    check_order,
)
from ledger.signing import Envelope, key_id_for, sign_envelope, verify_envelope

REPLAY_PATH = "/ledger/v1/replay"


def _order(raw: bytes, state: WorkerState) -> dict[str, Any]:
    if state.log_public_key is None:
        raise VerificationError(
            "this collector does not know the ledger's log key, so it takes no replay orders",
            code="replays_disabled",
        )
    try:
        env = Envelope.from_dict(json.loads(raw))
    except ValueError as exc:
        raise InvalidInput(f"not a JSON envelope: {exc}", code="invalid_order") from exc
    if env.kind != ORDER_KIND:
        raise InvalidInput(f"expected a {ORDER_KIND}, got {env.kind!r}", code="invalid_order")
    if env.key_id != key_id_for(state.log_public_key):
        raise VerificationError(
            f"the order is signed by {env.key_id}, not by the ledger's log key",
            code="not_signed_by_ledger",
        )
    verify_envelope(env, state.log_public_key)
    order = check_order(env.body, state.worker_id)
    _once(state.seen_orders, order["replay_id"])
    return order


def _once(seen: dict[str, float], replay_id: str) -> None:
    """An order runs once: a captured order re-sent within its lifetime is refused."""
    now = time.monotonic()
    if len(seen) > 10_000:
        horizon = now - ORDER_MAX_AGE.total_seconds() * 2
        for key in [k for k, t in seen.items() if t < horizon]:
            del seen[key]
    if replay_id in seen:
        raise VerificationError(f"order {replay_id} was already run", code="order_replayed")
    seen[replay_id] = now


async def _run(engine: Upstream, endpoint: str, raw: bytes) -> tuple[Accumulator, int]:
    acc = Accumulator(endpoint)
    began = time.perf_counter_ns()
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidInput("the order's request is not JSON", code="invalid_order") from exc
    headers = {"content-type": "application/json"}
    async with engine.stream("POST", endpoint, body=raw, headers=headers) as upstream:
        if upstream.status != 200:
            text = (await upstream.read())[:500].decode("utf-8", "replace")
            raise Unreachable(
                f"the engine answered HTTP {upstream.status}: {text}", code="engine_error"
            )
        if body.get("stream"):
            async for lines in upstream.lines():
                for line in lines:
                    if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                        acc.feed(json.loads(line[6:]))
        else:
            acc.feed(json.loads(await upstream.read()))
    return acc, time.perf_counter_ns() - began


async def handle_replay(request: Request, state: WorkerState, engine: Upstream) -> Response:
    """The endpoint: the signed output, or the collector's error answer (``collectors/errors.py``:
    an order that does not verify is 403, a malformed one 400, an engine that fails it 502)."""
    try:
        order = _order(await request.body(), state)
        try:
            raw = binascii.a2b_base64(order["request_raw"].encode("ascii"), strict_mode=True)
        except (binascii.Error, ValueError, AttributeError) as exc:
            raise InvalidInput("request_raw is not base64", code="invalid_order") from exc
        if state.fingerprint_unsure is not None:  # its output would be signed under the old one
            raise unsure()
        started = utc_now()
        fingerprint_id = state.fingerprint_id  # the environment the replay actually ran under
        acc, elapsed = await _run(engine, order["endpoint"], raw)
        choices = [
            ReplayedChoice(choice, margins)
            for choice, margins in zip(acc.record_choices(), acc.margins(), strict=True)
        ]
        body = build_output(
            order=order,
            fingerprint_id=fingerprint_id,
            prompt_token_ids=acc.prompt_token_ids or [],
            choices=choices,
            system_fingerprint=acc.system_fingerprint,
            started_at=started,
            total_ns=elapsed,
        )
    except LedgerError as exc:
        state.metrics.refusals.labels(exc.code).inc()
        return error_response(exc)
    state.metrics.replays.inc()
    envelope = sign_envelope(OUTPUT_KIND, body, state.key)
    return Response(envelope.canonical, 200, media_type="application/json")
