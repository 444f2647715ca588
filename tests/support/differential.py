"""Send one request to vLLM alone and through a collector, and compare what each client got.

The collector's promise is that a client sees what vLLM alone would have sent: the same status,
the same body (but for the IDs and times vLLM makes up per request) and, when streamed, the
same events. :func:`differ` sends raw bytes with raw headers (no client library between), so a
caller, or a generated test, can try anything: bodies that are not JSON, odd content types,
methods, header values. The collector under test is an in-process proxy with a spool and no
shipper (:func:`running_collector`): the records it made are read from its spool.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from collectors.proxy import create_proxy
from collectors.spool import Spool
from collectors.tokens import TokenRenderer
from collectors.worker_state import WorkerState
from demo.server_thread import ServerThread, free_port
from ledger.inference_record import body_view
from ledger.record_v2 import as_wire_item
from ledger.signing import SigningKey

# Members vLLM sets afresh for every request (and the collector passes on as they came).
VOLATILE = ("id", "created")


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes
    request_id: str | None  # the X-Request-ID the answer carried
    # vLLM's headers a client must get as they came: CORS (Access-Control-*), Vary and Allow
    # (the collector's own answers carry vLLM's CORS headers and Vary too: own_answers).
    passed: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def events(self) -> list[str]:
        """The server-sent events' data, in order (``[DONE]`` included)."""
        return [e[6:] for e in self.body.decode().split("\n\n") if e.startswith("data: ")]

    def normalised(self) -> Any:
        """The body with per-request IDs and times removed (JSON, each event, or raw bytes)."""
        if self.content_type.startswith("text/event-stream"):
            return merged_stream([_parse(e) for e in self.events])
        if self.content_type.startswith("application/json") and self.body:  # HEAD: none
            return _stable(self.json())
        return self.body


def _parse(event: str) -> Any:
    try:
        return json.loads(event)
    except ValueError:
        return event


def merged_stream(events: list[Any]) -> dict[str, Any]:
    """A stream's content without its chunking: vLLM alone splits the same output into
    chunks differently from run to run (a busy server coalesces tokens), so per choice the
    deltas are joined (text and lists concatenated, other values the last given); events
    without choices (errors, ``[DONE]``) are kept in order, top-level members the last seen."""
    choices: dict[int, Any] = {}
    top: dict[str, Any] = {}
    others: list[Any] = []
    for event in events:
        if not isinstance(event, dict) or "choices" not in event:
            others.append(_stable(event))
            continue
        for key, value in _stable(event).items():
            if key != "choices" and value is not None:
                top[key] = value
        for choice in event["choices"] or []:
            index = choice.get("index", 0)
            choices[index] = _merge(choices.get(index), choice)
    return {"choices": choices, "top": top, "others": others}


def _merge(acc: Any, new: Any) -> Any:
    if acc is None:
        return new
    if new is None:
        return acc
    if isinstance(acc, str) and isinstance(new, str):
        return acc + new
    if isinstance(acc, list) and isinstance(new, list):
        return acc + new
    if isinstance(acc, dict) and isinstance(new, dict):
        return {**acc, **{k: _merge(acc.get(k), v) for k, v in new.items()}}
    return new


def _stable(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if k not in VOLATILE}
    return data


def send(
    base_url: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str = "POST",
    timeout: float = 120.0,
) -> Answer:
    with httpx.Client(timeout=timeout) as client:
        response = client.request(method, base_url + path, content=body, headers=headers or {})
    return Answer(
        response.status_code,
        response.headers.get("content-type", ""),
        response.content,
        response.headers.get("x-request-id"),
        {
            name: value
            for name, value in response.headers.items()
            if name.startswith("access-control-") or name in ("allow", "vary")
        },
    )


def body_of(value: Any) -> bytes:
    """JSON bytes for a request body (NaN kept as vLLM's parser takes it)."""
    return json.dumps(value).encode()


@dataclass
class Differential:
    """What vLLM alone and the collector answered to the same request."""

    alone: Answer
    through: Answer

    def assert_same(self) -> None:
        assert self.through.status == self.alone.status, (self.alone, self.through)
        assert self.through.normalised() == self.alone.normalised(), (self.alone, self.through)
        assert self.through.passed == self.alone.passed, (self.alone, self.through)


def differ(
    engine_url: str,
    collector_url: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str = "POST",
) -> Differential:
    """Send the same request to vLLM alone and through the collector."""
    alone = send(engine_url, path, body, headers, method)
    through = send(collector_url, path, body, headers, method)
    return Differential(alone, through)


@dataclass
class CollectorUnderTest:
    url: str
    state: WorkerState

    def records(self, request_id: str) -> list[dict[str, Any]]:
        """The record bodies spooled under ``request_id`` (the spool keeps one per ID)."""
        items = self.state.spool.oldest(100_000)
        return [
            body_view(json.loads(as_wire_item(item.envelope)))
            for item in items
            if item.request_id == request_id
        ]

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.state.metrics.registry.get_sample_value(name, labels or {})
        return value or 0.0


@contextmanager
def running_collector(
    engine_url: str, model_dir: Path | None, spool_dir: Path, **state: Any
) -> Iterator[CollectorUnderTest]:
    """A recording proxy over real HTTP before ``engine_url``, spooling (never shipping)."""
    spool = Spool(spool_dir / "spool.sqlite")
    worker = WorkerState(
        engine_url=engine_url,
        worker_id="w",
        pool="p",
        key=SigningKey.generate(),
        spool=spool,
        fingerprint_id="sha256:" + "0" * 64,
        renderer=TokenRenderer.from_model_dir(model_dir) if model_dir is not None else None,
        **{"default_tier": 0, "batch_invariance": "serial", **state},
    )
    server = ServerThread(create_proxy(worker), "127.0.0.1", free_port()).start()
    try:
        yield CollectorUnderTest(server.url, worker)
    finally:
        server.stop()
        spool.close()
