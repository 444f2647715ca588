"""The one place where the collector's own errors become HTTP answers.

Clients of the proxy speak OpenAI's API, so every answer the collector makes up itself (not
vLLM's, which pass through as they came) has OpenAI's error shape, a superset of the ledger's
``{"error": {"code", "message"}}``::

    {"error": {"message": "...", "type": "invalid_request_error", "code": "...", "details": {}}}

``type`` is ``invalid_request_error`` below 500 and ``server_error`` from 500. Bad input is 400
here, where the ledger's API says 422: the proxy answers as vLLM does, and vLLM refuses a bad
request with 400. The replay endpoint (``collectors/replay.py``) answers the ledger through the
same table: an order that does not verify is 403, an engine that fails it 502.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from collectors.edge import REQUEST_ID_HEADER
from collectors.upstream import ANSWER_MARK, UNASKED
from ledger.errors import (
    Conflict,
    InvalidInput,
    LedgerError,
    NotFound,
    Pushback,
    StorageError,
    TooLarge,
    Unreachable,
    VerificationError,
)

# Most specific first; anything else is 500.
STATUS: list[tuple[type[LedgerError], int]] = [
    (TooLarge, 413),
    (InvalidInput, 400),
    (VerificationError, 403),
    (NotFound, 404),
    (Conflict, 409),
    (Unreachable, 502),
    (Pushback, 503),
    (StorageError, 503),
]


def status_for(exc: LedgerError) -> int:
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def _retry_after(exc: LedgerError) -> dict[str, str]:
    """As the API writes it (api/errors.py): whole seconds, at least 1; a storage error 1."""
    if isinstance(exc, Pushback):
        return {"Retry-After": str(max(1, round(exc.retry_after)))}
    return {"Retry-After": "1"} if isinstance(exc, StorageError) else {}


def error_response(exc: LedgerError, request_id: str | None = None) -> JSONResponse:
    """The collector's own answer to ``exc``, with the request's ID when it has one."""
    status = status_for(exc)
    return JSONResponse(
        {
            "error": {
                "message": exc.message,
                "type": "invalid_request_error" if status < 500 else "server_error",
                "code": exc.code,
                "details": exc.details,
            }
        },
        status_code=status,
        headers={
            **({REQUEST_ID_HEADER: request_id} if request_id is not None else {}),
            **_retry_after(exc),
            # no CORS headers for a browser while the engine does not answer (own_answers)
            **({ANSWER_MARK: UNASKED} if isinstance(exc, Unreachable) else {}),
        },
    )
