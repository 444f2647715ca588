"""One exchange under way (a client's request, vLLM's answer) and the signed record it leaves.

An :class:`Exchange` gathers what vLLM answered (``collectors/exchange.py``'s accumulator and
client view), and when the answer is complete signs the record and puts it in the durable
spool: :meth:`Exchange.spool_async` from the request's own handler, before the client gets the
end of the answer; :func:`record_aborted`, in a task of its own, for a client that left
mid-stream. An answer no record can hold is counted in ``collector_unrecordable_total``, never
dropped silently (:func:`count_unrecordable`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from dataclasses import dataclass
from typing import Any

from collectors.exchange import Accumulator, ClientView, Plan, dumps
from collectors.metrics import CollectorMetrics
from collectors.worker_state import WorkerState
from ledger.clock import utc_now
from ledger.errors import InvalidInput, LedgerError
from ledger.record_v2 import commit_record, wire_item
from ledger.records import RECORD_KIND, build_record_body
from ledger.signing import sign_envelope

logger = logging.getLogger("ledger.collector")


@dataclass
class Exchange:
    state: WorkerState
    endpoint: str
    request_id: str
    tier: int
    fingerprint_id: str
    plan: Plan
    engine_raw: bytes
    started_at: str
    started_ns: int
    acc: Accumulator
    view: ClientView
    ttft_ns: int | None = None
    own_s: float = 0.0  # the collector's own time on this exchange so far
    streaming: bool = False  # a streamed answer's chunks began to flow
    engine_error: bool = False  # the engine sent an error chunk mid-stream

    @classmethod
    def begin(
        cls,
        state: WorkerState,
        endpoint: str,
        request_id: str,
        tier: int,
        plan: Plan,
        engine_raw: bytes,
    ) -> Exchange:
        """An exchange starting now, under the worker's current fingerprint."""
        return cls(
            state=state,
            endpoint=endpoint,
            request_id=request_id,
            tier=tier,
            fingerprint_id=state.fingerprint_id,
            plan=plan,
            engine_raw=engine_raw,
            started_at=utc_now(),
            started_ns=time.perf_counter_ns(),
            acc=Accumulator(endpoint, top_k=plan.top_k),
            view=ClientView(plan, state.renderer),
        )

    def for_client(self, data: dict[str, Any]) -> bytes:
        """vLLM's answer (or chunk) in the shape the client asked for, without what the
        collector added for the record."""
        out = dumps(self.view.shape(data))
        if self.view.mismatches:
            self.state.metrics.render_mismatches.inc(self.view.mismatches)
            logger.warning(
                "request %s: %d token(s) rendered from IDs differed from vLLM's strings",
                self.request_id,
                self.view.mismatches,
            )
            self.view.mismatches = 0
        return out

    def record(self, *, aborted: bool) -> bytes:
        """The spool item of the record (``ledger.record_v2.wire_item``: the signed v2
        envelope's canonical bytes and its disclosures; InvalidInput: nothing to record)."""
        total = time.perf_counter_ns() - self.started_ns
        self._check_system_fingerprint()
        body = build_record_body(
            request_id=self.request_id,
            fingerprint_id=self.fingerprint_id,
            worker_id=self.state.worker_id,
            pool=self.state.pool,
            tier=self.tier,
            endpoint=self.endpoint,
            model=self.acc.model or str(self.plan.engine_body.get("model", "")),
            request=self.plan.recorded_body,
            prompt_token_ids=self.acc.prompt_token_ids or [],
            choices=self.acc.record_choices(),
            started_at=self.started_at,
            ttft_ns=self.ttft_ns if self.ttft_ns is not None else total,
            total_ns=total,
            system_fingerprint=self.acc.system_fingerprint,
            request_raw=base64.b64encode(self.engine_raw).decode("ascii"),
            aborted=True if aborted else None,
        )
        committed, disclosures = commit_record(body)
        return wire_item(
            sign_envelope(RECORD_KIND, committed, self.state.key).canonical, disclosures
        )

    def _check_system_fingerprint(self) -> None:
        """Count (and log) a response whose system_fingerprint is not the engine's expected
        one; the record keeps what the engine answered."""
        expected = self.state.expected_system_fingerprint
        answered = self.acc.system_fingerprint
        if expected is not None and answered is not None and answered != expected:
            self.state.metrics.system_fingerprint_mismatches.inc()
            logger.warning(
                "request %s: the engine answered system_fingerprint %r, expected %r (%s)",
                self.request_id,
                answered,
                expected,
                self.fingerprint_id,
            )

    async def spool_async(self) -> None:
        """Sign here (a fraction of a millisecond) and wait for the spool's durable commit.

        With no other exchange in flight, the commit (an fsync: about a millisecond on a busy
        host) runs right here, saving two thread hand-offs; a request arriving meanwhile waits
        that long to be read. Otherwise the spool's writer commits it with whatever else has
        queued up, in one transaction.
        """
        envelope = self.record(aborted=self.engine_error)
        spool = self.state.spool
        if len(self.state.in_flight) > 1 or not spool.put_now(self.request_id, envelope):
            await asyncio.wrap_future(spool.submit(self.request_id, envelope))
        self.state.metrics.spooled.inc()


def count_unrecordable(ex: Exchange, exc: InvalidInput, metrics: CollectorMetrics) -> None:
    """An answer the client got that no record can hold: counted and logged."""
    metrics.unrecordable.labels("record_invalid").inc()
    metrics.requests.labels(ex.endpoint, "unrecordable").inc()
    logger.warning("request %s: answered, but no record can hold it: %s", ex.request_id, exc)


def record_aborted(ex: Exchange, metrics: CollectorMetrics) -> None:
    """Record what a client that left mid-stream was sent. The handler that would have awaited
    it is being cancelled, so the record is signed and committed by a task of its own on the
    same loop (``state.leaving``, which the proxy waits for before it stops). On the loop, not
    on a thread: a thread gets the GIL from a busy loop only every switch interval, so under a
    burst of leaving clients its queue, each item a whole answer, grew by hundreds of megabytes
    (docs/PERFORMANCE.md). With no loop running here, it commits before returning."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(_spool_aborted(ex, metrics))
        return
    task = loop.create_task(_spool_aborted(ex, metrics))
    ex.state.leaving.add(task)
    task.add_done_callback(ex.state.leaving.discard)


async def drain_aborted(state: WorkerState, timeout: float = 30.0) -> None:
    """Wait until the records of clients that left are in the spool (the proxy is stopping)."""
    while state.leaving:
        _, pending = await asyncio.wait(set(state.leaving), timeout=timeout)
        if pending:
            logger.error("%d records of clients that left were not spooled in time", len(pending))
            return


async def _spool_aborted(ex: Exchange, metrics: CollectorMetrics) -> None:
    """``collector_requests_total`` counts the outcome the spool holds: ``aborted`` for a
    record marked so, ``recorded`` when the whole answer's record was committed just as the
    client left."""
    try:
        envelope = ex.record(aborted=True)
        await asyncio.wrap_future(ex.state.spool.submit(ex.request_id, envelope))
    except InvalidInput as exc:
        count_unrecordable(ex, exc, metrics)
    except LedgerError as exc:
        if exc.code == "request_id_in_use":
            # The whole exchange was committed as the client left: that record stands.
            logger.info("request %s: the client left as its record was committed", ex.request_id)
            metrics.spooled.inc()
            metrics.requests.labels(ex.endpoint, "recorded").inc()
            return
        metrics.refusals.labels(exc.code).inc()
        metrics.requests.labels(ex.endpoint, "not_recorded").inc()
    except Exception:  # a bug: logged and counted, not a task error that nobody reads
        logger.exception("request %s: the record of a client that left failed", ex.request_id)
        metrics.requests.labels(ex.endpoint, "not_recorded").inc()
    else:
        metrics.spooled.inc()
        metrics.requests.labels(ex.endpoint, "aborted").inc()
