"""The OpenAPI document's security and limits, read from the same rules the gate enforces.

FastAPI does not see the gate (``api.gate``) nor the settings, so the generated document is
completed once, on first request: the ``bearer`` security scheme (``/docs`` shows an
Authorize button), ``security`` and the required scope on every protected operation and on no
public one, and the configured limits (body bytes, body time, batch size, page size) in the
description of the API and of each operation that takes a body.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from api.gate import RouteRules
from api.routes.workers import HEARTBEAT_MAX_BYTES
from api.settings import Settings
from ledger.storage.queries import MAX_PAGE

SCHEME = "bearer"
_INGEST = ("/v1/records", "post")
_HEARTBEAT = "/v1/workers"


def limits_text(settings: Settings) -> str:
    return (
        f"Limits: a request body holds at most {settings.max_body_bytes} bytes "
        f"(LEDGER_MAX_BODY_BYTES; more is 413 `body_too_large`, counted as it arrives) and "
        f"must arrive within {settings.body_timeout:g} s of waiting (LEDGER_BODY_TIMEOUT; "
        f"then 408 `body_timeout` and the connection is closed); an ingest batch holds at "
        f"most {settings.max_batch_records} envelopes (LEDGER_MAX_BATCH_RECORDS; more is 413 "
        f"`batch_too_large`); a search page at most {MAX_PAGE} records."
    )


def _append(op: dict[str, Any], text: str) -> None:
    op["description"] = f"{op['description']}\n\n{text}" if op.get("description") else text


def document(schema: dict[str, Any], rules: RouteRules, settings: Settings) -> dict[str, Any]:
    """Complete a generated OpenAPI document in place and return it."""
    schema.setdefault("components", {}).setdefault("securitySchemes", {})[SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "An API token (`ledger tokens create`); its scopes decide the routes.",
    }
    _append(schema["info"], limits_text(settings))

    def body_limit(path: str) -> str:
        limit = settings.max_body_bytes
        if path == _HEARTBEAT:
            limit = min(HEARTBEAT_MAX_BYTES, limit)
        return (
            f"The body holds at most {limit} bytes and must arrive within "
            f"{settings.body_timeout:g} s."
        )

    for rule in rules.rules:
        path = rule.context.path_format
        if not isinstance(rule.route, APIRoute) or path not in schema["paths"]:
            continue
        for method in rule.context.methods or ():
            op = schema["paths"][path].get(method.lower())
            if op is None:
                continue
            responses = op.setdefault("responses", {})
            if rule.protected:
                op["security"] = [{SCHEME: []}]
                if rule.scope is not None:
                    op["x-required-scope"] = rule.scope
                    _append(op, f"Requires a token with the `{rule.scope}` scope (or `admin`).")
                else:
                    _append(op, "Requires a valid token, of any scope.")
                    responses.pop("403", None)
            else:
                responses.pop("401", None)
                responses.pop("403", None)
            if "requestBody" in op:
                _append(op, body_limit(path))
                error = {"$ref": "#/components/schemas/ErrorResponse"}
                for status, what in (("408", "body_timeout"), ("413", "body_too_large")):
                    responses.setdefault(
                        status,
                        {"description": what, "content": {"application/json": {"schema": error}}},
                    )
            if (path, method.lower()) == _INGEST:
                _append(op, f"A batch holds at most {settings.max_batch_records} records.")
                body = op["requestBody"]["content"]["application/json"]["schema"]
                for form in body["oneOf"]:  # {"records": [...]} or {"envelopes": [...]}
                    for items in form["properties"].values():
                        items["maxItems"] = settings.max_batch_records
                        items["minItems"] = 1  # 422 empty_batch
    return schema


def install(app: FastAPI, settings: Settings) -> None:
    """Serve the completed document at /openapi.json (and so in /docs)."""
    generate = app.openapi
    documented: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not documented:
            # A deep copy: FastAPI's document shares dicts with module-level schemas.
            schema = copy.deepcopy(generate())
            documented.update(document(schema, RouteRules(app.router.routes), settings))
            app.openapi_schema = documented
        return documented

    app.openapi = openapi  # type: ignore[method-assign]
