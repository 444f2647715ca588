"""Record ingest (atomic batches of signed envelopes), retrieval and search."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from api.auth import ReadRecords, WriteRecords
from api.body import parse_json, read_json_bytes
from api.schemas import ERRORS, RECORD_BATCH_SCHEMA, IngestResponse, repeated
from api.state import AppState, StateDep
from ledger.compare import VERDICTS
from ledger.errors import InvalidInput, TooLarge
from ledger.storage import ingest, proofs, queries, record_search, verdicts

router = APIRouter(prefix="/v1/records", tags=["records"], responses=ERRORS)


@router.post(
    "",
    response_model=IngestResponse,
    status_code=201,
    responses=repeated("every record of the batch was already logged (each a `duplicate`)"),
    summary="Ingest a batch of signed inference records (atomic)",
    description=(
        "The batch is atomic: if any envelope is malformed, fails verification or conflicts "
        "with a held record, nothing is written and the error names the item index. A request "
        "ID already held with identical content is reported as `duplicate` (idempotent). "
        "When too many batches are in flight the answer is 503 `busy` with Retry-After."
    ),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": RECORD_BATCH_SCHEMA}},
        }
    },
)
async def ingest_records(request: Request, state: StateDep, _: WriteRecords) -> Response:
    with state.ingest_limit.admit(_declared_size(request, state.settings.max_body_bytes)):
        return await _ingest(request, state)


def _declared_size(request: Request, limit: int) -> int:
    """The body's Content-Length, capped at ``limit`` (the body limit refuses larger ones);
    ``limit`` when it declares none or an unreadable one."""
    try:
        return max(0, min(int(request.headers.get("content-length", "")), limit))
    except ValueError:
        return limit


async def _ingest(request: Request, state: AppState) -> Response:
    raw = await read_json_bytes(request, state.settings.max_body_bytes)
    # Parsed, validated and signature-checked in one worker thread (no lock, no write) ...
    checked = await run_in_threadpool(_checked, raw, state)
    # ... then appended by the process's writer with whatever other batches are waiting (one
    # lock and one commit for all), and answered once the transaction holding it committed.
    results = await asyncio.wrap_future(state.ingest_writer.submit(checked, len(checked)))
    created = sum(r.status == "created" for r in results)
    state.metrics.batch_size.observe(len(results))
    state.metrics.records.labels("created").inc(created)
    state.metrics.records.labels("duplicate").inc(len(results) - created)
    body = {
        "created": created,
        "duplicates": len(results) - created,
        "results": [r.to_dict() for r in results],
    }
    return Response(
        json.dumps(body).encode(),
        status_code=201 if created else 200,
        media_type="application/json",
    )


def _checked(raw: bytes, state: AppState) -> ingest.CheckedBatch:
    items = batch_items(parse_json(raw))
    limit = state.settings.max_batch_records
    if len(items) > limit:
        raise TooLarge(
            f"batch of {len(items)} records exceeds the limit of {limit}",
            code="batch_too_large",
            details={"limit": limit},
        )
    return ingest.check_batch(state.db, items)


_BATCH_SHAPE = (
    'body must be {"records": [{"envelope": <signed envelope>, "disclosures": [...]}, ...]} '
    '(or, for schema v1 records only, {"envelopes": [<signed envelope>, ...]})'
)


def batch_items(data: object) -> list[ingest.RecordItem]:
    """The records of a batch body, in either form (``records`` with disclosures, or the
    v1 form ``envelopes``)."""
    if not isinstance(data, dict) or len(data) != 1 or not set(data) <= {"records", "envelopes"}:
        raise InvalidInput(_BATCH_SHAPE, code="schema_violation")
    if "envelopes" in data:
        if not isinstance(data["envelopes"], list):
            raise InvalidInput("envelopes must be a list", code="schema_violation")
        return [ingest.RecordItem(env) for env in data["envelopes"]]
    records = data["records"]
    if not isinstance(records, list):
        raise InvalidInput("records must be a list", code="schema_violation")
    items = []
    for i, item in enumerate(records):
        if (
            not isinstance(item, dict)
            or "envelope" not in item
            or not set(item) <= {"envelope", "disclosures"}
            or not isinstance(item.get("disclosures", []), list)
        ):
            raise InvalidInput(
                f'records[{i}] must be {{"envelope": ..., "disclosures": [...]}}',
                code="schema_violation",
                details={"item": i},
            )
        items.append(ingest.RecordItem(item["envelope"], item.get("disclosures", [])))
    return items


def render_record(item: queries.StoredRecord, with_envelope: bool = True, **extra: object) -> bytes:
    meta = json.dumps({**item.meta(), **extra}).encode()
    if not with_envelope:
        return meta
    # The stored canonical envelope is spliced in unchanged: the logprob bits are the signed ones.
    out = meta[:-1] + b',"envelope":' + item.envelope
    if item.disclosures:
        out += b',"disclosures":' + json.dumps(list(item.disclosures)).encode()
    return out + b"}"


@router.get(
    "/{request_id}",
    summary="One record and its signed envelope, by request ID",
    description="Every member is read from the logged envelope (the receive time from its log "
    "entry); an index row that does not point at this record's entry is 500 `index_mismatch`.",
)
async def get_record(request_id: str, state: StateDep, _: ReadRecords) -> Response:
    item = await run_in_threadpool(queries.get_record, state.db, request_id)
    replays = await run_in_threadpool(verdicts.verdicts_of, state.db, request_id)
    return Response(render_record(item, replays=replays), media_type="application/json")


@router.get(
    "/{request_id}/evidence",
    summary="An offline-verifiable evidence bundle for a record",
    description="Envelope, leaf index, inclusion proof, a signed checkpoint covering it, the "
    "fingerprint the record names with its proof, and "
    "the collector and log public keys. Verify with `ledger verify BUNDLE --log-key FILE`.",
)
async def get_evidence(
    request_id: str,
    state: StateDep,
    _: ReadRecords,
    redact: Annotated[
        str | None,
        Query(
            description="comma-separated members or groups to leave out (prompt, output, "
            "token_ids, text, logprobs, request, request_raw, choices[N].text, ...)",
            max_length=1000,
        ),
    ] = None,
) -> Response:
    queries.check_request_id(request_id)
    names = [n.strip() for n in (redact or "").split(",") if n.strip()]
    bundle = await run_in_threadpool(
        proofs.evidence, state.db, state.log_key, state.origin, request_id, names
    )
    return Response(json.dumps(bundle).encode(), media_type="application/json")


@router.get(
    "",
    summary="Search records (log order or newest first, cursor pagination)",
    description="Filters combine with AND. `since`/`until` (RFC 3339 with a zone) apply to the "
    "ledger's receive time. `verdict` keeps records with a logged replay verdict of that value "
    "(`none`: never replayed); `content` is `complete`, `erased` or `in_log` (schema v1); "
    "`held` keeps records a legal hold does (or does not) cover. Every item is built from its "
    "logged envelope, its verdicts from their logged leaves, and kept only if, as logged, it "
    "satisfies the filters: a page may hold fewer than `limit` items while `next_cursor` is "
    "set; follow it until it is null. Each item adds `verdict` (the latest) and `held_by`.",
)
async def search_records(
    state: StateDep,
    _: ReadRecords,
    params: Annotated[SearchParams, Depends()],
    limit: Annotated[int, Query(ge=1, le=queries.MAX_PAGE)] = 100,
    cursor: str | None = None,
    order: Literal["log", "newest"] = "log",
    fields: Literal["full", "meta"] = "full",
) -> Response:
    page = await run_in_threadpool(
        record_search.search,
        state.db,
        params.to_filter(),
        limit=limit,
        cursor=cursor,
        newest_first=order == "newest",
    )
    items = b",".join(render_hit(i, fields == "full") for i in page.items)
    tail = json.dumps({"next_cursor": page.next_cursor, "count": len(page.items)}).encode()
    return Response(b'{"items":[' + items + b"]," + tail[1:], media_type="application/json")


def render_hit(hit: record_search.Hit, with_envelope: bool = True) -> bytes:
    return render_record(hit.record, with_envelope, verdict=hit.verdict, held_by=hit.held_by)


@dataclass
class SearchParams:
    """The search filters as query parameters (the console parses the same names from its
    form, empty fields meaning "any": ``api.ui.routes.search_filter``)."""

    since: Annotated[str | None, Query(json_schema_extra={"format": "date-time"})] = None
    until: Annotated[str | None, Query(json_schema_extra={"format": "date-time"})] = None
    model: str | None = None
    fingerprint_id: str | None = None
    tier: Annotated[int | None, Query(ge=0, le=2)] = None
    pool: str | None = None
    worker_id: str | None = None
    aborted: bool | None = None
    verdict: Annotated[
        str | None, Query(description=f"one of {[*VERDICTS, record_search.NO_VERDICT]}")
    ] = None
    content: Literal["complete", "erased", "in_log"] | None = None
    held: bool | None = None

    def to_filter(self) -> record_search.SearchFilter:
        return record_search.SearchFilter(
            records=queries.RecordFilter(
                since=queries.parse_time(self.since, "since"),
                until=queries.parse_time(self.until, "until"),
                model=self.model,
                fingerprint_id=self.fingerprint_id,
                tier=self.tier,
                pool=self.pool,
            ),
            worker_id=self.worker_id,
            aborted=self.aborted,
            verdict=self.verdict,
            content=self.content,
            held=self.held,
        )
