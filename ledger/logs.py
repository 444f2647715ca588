"""Log lines for the ledger and the collectors: text for people, JSON for log pipelines.

``ledger serve`` and ``ledger collect`` take ``--log-format text|json``; both configure the
standard library's logging with :func:`logging_config` (also given to uvicorn, so its access
and error lines come out the same way). The request being served is in every line: the HTTP
edge sets :data:`REQUEST_ID` for the request's context (the API from ``X-Request-ID`` or a new
ID, the collector from the request ID it records under), and :class:`RequestIdFilter` copies it
onto each record, ``-`` outside a request.

A JSON line is one object: ``time`` (RFC 3339, UTC, microseconds), ``level``, ``logger``,
``message``, ``request_id`` (null outside a request), ``pid`` (the process: ``serve --workers``
runs several), ``exception`` (the traceback, when there
is one), and for uvicorn's access lines ``client``, ``method``, ``path`` and ``status``.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "json"]
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
REQUEST_ID: ContextVar[str | None] = ContextVar("ledger_request_id", default=None)
_TEXT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


class RequestIdFilter(logging.Filter):
    """Puts the current request's ID on every record (``-`` outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get() or "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": None if request_id in (None, "-") else request_id,
            "pid": record.process,
        }
        access = record.args if record.name == "uvicorn.access" else None
        if isinstance(access, tuple) and len(access) == 5:
            client, method, path, _, status = access
            line.update(client=client, method=method, path=path, status=status)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(_TEXT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def logging_config(fmt: LogFormat = "text", level: str = "info") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` for our loggers and uvicorn's: one stderr handler,
    the request ID on every line."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, not {fmt!r}")
    formatter = "ledger.logs.JsonFormatter" if fmt == "json" else "ledger.logs.TextFormatter"
    handler = {
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
        "formatter": "line",
        "filters": ["request_id"],
    }
    loud = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": "ledger.logs.RequestIdFilter"}},
        "formatters": {"line": {"()": formatter}},
        "handlers": {"stderr": handler},
        "loggers": {
            "ledger": {"handlers": ["stderr"], "level": loud, "propagate": False},
            "uvicorn": {"handlers": ["stderr"], "level": loud, "propagate": False},
            "uvicorn.error": {"level": loud},
            "uvicorn.access": {"handlers": ["stderr"], "level": loud, "propagate": False},
        },
    }
