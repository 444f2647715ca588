"""Reading request bodies: size-limited, strict JSON (no NaN, no duplicate members).

Every route with a body reads it here: ingest and fingerprints as raw JSON (``read_json``),
the others into a strict pydantic model (``json_body``), never through FastAPI's own body
parameters, which parse before any dependency runs and accept NaN and duplicate members.
The gate (``api.gate``) has checked the token and scope before the first byte is read, and
counts and times the bytes as they arrive; the limit here is the same one, checked again.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from api.state import get_state
from ledger.errors import InvalidInput, TooLarge

M = TypeVar("M", bound=BaseModel)
# A body past this is parsed off the event loop: parsing megabytes takes milliseconds.
LOOP_BODY = 64 * 1024


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidInput(f"duplicate JSON member {key!r}", code="invalid_json")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise InvalidInput(f"{name} is not valid JSON", code="invalid_json")


def parse_json(raw: bytes) -> Any:
    """A JSON body (RFC 8259: UTF-8 only; json.loads of bytes would also take UTF-16 and
    UTF-32, and decode surrogate code points encoded as bytes)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"body is not UTF-8 text: {exc}", code="invalid_json") from exc
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"body is not valid JSON: {exc}", code="invalid_json") from exc
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise InvalidInput(f"body is not acceptable JSON: {exc}", code="invalid_json") from exc
    except RecursionError as exc:
        raise InvalidInput("body is nested too deeply", code="invalid_json") from exc


async def read_body(request: Request, limit: int) -> bytes:
    """Read the body, refusing it (413) as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(
            f"body of {declared} bytes exceeds the limit of {limit} bytes",
            code="body_too_large",
            details={"limit": limit},
        )
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise TooLarge(
                    f"body exceeds the limit of {limit} bytes",
                    code="body_too_large",
                    details={"limit": limit},
                )
            chunks.append(chunk)
    except ClientDisconnect as exc:  # nobody reads the answer; keep it out of the error log
        raise InvalidInput("the client left before sending its body", code="invalid_json") from exc
    return b"".join(chunks)


def content_type_problem(header: str | None) -> str | None:
    """Why a Content-Type does not announce a JSON document; None when it does (absent or
    empty, or ``application/json`` in any case with no charset but UTF-8's: RFC 8259)."""
    if header is None:
        return None
    media, *params = (part.strip() for part in header.split(";"))
    if media.lower() not in ("application/json", ""):
        return f"content type must be application/json, got {media[:100]!r}"
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return f"a JSON document is UTF-8, not {value.strip()[:40]!r}"
    return None


async def read_json_bytes(request: Request, limit: int) -> bytes:
    """The body of a request that must carry a JSON document, unparsed (checks the content
    type and that there is a body)."""
    problem = content_type_problem(request.headers.get("content-type"))
    if problem is not None:
        raise InvalidInput(problem, code="invalid_json")
    raw = await read_body(request, limit)
    if not raw:
        raise InvalidInput("body is empty; a JSON document is required", code="invalid_json")
    return raw


async def read_json(request: Request, limit: int) -> Any:
    raw = await read_json_bytes(request, limit)
    if len(raw) > LOOP_BODY:
        return await run_in_threadpool(parse_json, raw)
    return parse_json(raw)


def validate_model(model: type[M], data: Any) -> M:
    """``data`` as ``model`` (strict: ``true`` is not 1); a violation is 422 schema_violation."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from exc


def json_body(model: type[M]) -> Any:
    """A dependency that reads the body as strict JSON and validates it as ``model``."""

    async def _read(request: Request) -> M:
        limit = get_state(request).settings.max_body_bytes
        return validate_model(model, await read_json(request, limit))

    return Depends(_read)


def body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting a ``json_body`` route's body (FastAPI does not see it)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
