"""HTTP schemas (pydantic), for validation at the edge and for the OpenAPI document."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ledger.certify import MAX_CONCURRENCY, MAX_TOKENS
from ledger.heartbeat import MAX_PENDING
from ledger.key_scope import MAX_POOLS, POOL_PATTERN
from ledger.records import REQUEST_ID_PATTERN


def _stated(**schema: Any) -> dict[str, Any]:
    """OpenAPI for a bound the route checks itself, with its own error code (pydantic would
    answer schema_violation)."""
    return {"json_schema_extra": schema}


class StrictInput(BaseModel):
    """A request body: no unknown members, and no coercion (``true`` is not 1, 8.0 is not 8,
    ``"1"`` is not 1)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class StrictOutput(BaseModel):
    """An answer: validated strictly too, so a wrong type is a bug found, never coerced."""

    model_config = ConfigDict(strict=True)


class ErrorBody(StrictOutput):
    code: str = Field(description="stable machine-readable code, e.g. record_conflict")
    message: str
    details: dict[str, Any] | None = None


class ErrorResponse(StrictOutput):
    error: ErrorBody


class KeyCreate(StrictInput):
    name: str = Field(
        min_length=1,
        max_length=100,
        description="visible text, not only spaces; no control or invisible format characters",
    )
    role: str = Field(description="collector | replayer")
    public_key: str = Field(description="PEM (SubjectPublicKeyInfo) or ed25519:<base64 raw>")
    pools: list[str] | None = Field(
        default=None,
        description=(
            "collector keys only: the 1-64 pools whose records and worker heartbeats the key "
            "may sign (422 `invalid_pools` otherwise); absent or null: any pool"
        ),
        **_stated(
            minItems=1,
            maxItems=MAX_POOLS,
            uniqueItems=True,
            items={"type": "string", "pattern": POOL_PATTERN},
        ),
    )


class KeyRevoke(StrictInput):
    reason: str = Field(min_length=1, max_length=1000)


class KeyPublic(StrictOutput):
    key_id: str
    name: str
    role: str
    public_key: str
    pools: list[str] | None = Field(description="the pools the key may sign for; null: any")
    registered_at: str
    log_index: int
    revoked: bool
    revoked_at: str | None
    revocation_reason: str | None


class KeyList(StrictOutput):
    items: list[KeyPublic]


class TokenSelf(StrictOutput):
    token_id: str = Field(description="the token's display ID (never its secret)")
    name: str
    scopes: list[str]
    expires_at: str | None = Field(description="RFC 3339; null: never")


class FingerprintCreated(StrictOutput):
    fingerprint_id: str
    status: str = Field(description="created | duplicate")
    log_index: int


class IngestItem(StrictOutput):
    request_id: str
    status: str = Field(description="created | duplicate")
    log_index: int
    content_hash: str


class IngestResponse(StrictOutput):
    created: int
    duplicates: int
    results: list[IngestItem]


ENVELOPE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["kind", "body", "signature"],
    "properties": {
        "kind": {"type": "string"},
        "body": {"type": "object"},
        "signature": {
            "type": "object",
            "required": ["alg", "key_id", "sig"],
            "properties": {
                "alg": {"const": "ed25519"},
                "key_id": {"type": "string"},
                "sig": {"type": "string", "description": "base64 Ed25519 signature"},
            },
        },
    },
}

RECORD_BATCH_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "description": "Records of any schema version; a v2 record with every one of its "
            "disclosures (base64url, ledger.disclosures).",
            "required": ["records"],
            "additionalProperties": False,
            "properties": {
                "records": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["envelope"],
                        "additionalProperties": False,
                        "properties": {
                            "envelope": ENVELOPE_SCHEMA,
                            "disclosures": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                }
            },
        },
        {
            "type": "object",
            "description": "Schema v1 records only (no disclosures).",
            "required": ["envelopes"],
            "additionalProperties": False,
            "properties": {"envelopes": {"type": "array", "items": ENVELOPE_SCHEMA}},
        },
    ]
}

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse}
    for status in (400, 401, 403, 404, 405, 409, 410, 413, 422, 500, 503)
}
# what a route that asks a worker answers when the worker cannot be reached
UPSTREAM_ERRORS: dict[int | str, dict[str, Any]] = {502: {"model": ErrorResponse}}


def repeated(description: str) -> dict[int | str, dict[str, Any]]:
    """The 200 of a route that answers 201 the first time and 200 for the same request again."""
    return {200: {"description": description}}


class WorkerHeartbeat(BaseModel):
    """The body of a ``worker_heartbeat`` envelope, signed by the worker's collector key
    (for the OpenAPI document; ``ledger.heartbeat`` checks it)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    schema_version: int = Field(description="1")
    worker_id: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._\-]+$")
    pool: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._\-]+$")
    url: str = Field(
        min_length=1,
        max_length=500,
        description="the worker's collector URL: http(s), no userinfo, query or fragment; "
        "every address it resolves to must be allowed (LEDGER_WORKER_NETWORKS)",
    )
    fingerprint_id: str = Field(description="a registered fingerprint: sha256:<64 hex>")
    issued_at: str = Field(
        description="RFC 3339 UTC (…Z), within 60 s of the ledger's clock and later than the "
        "worker's last accepted heartbeat"
    )
    spool_pending: int | None = Field(
        default=None,
        ge=0,
        le=MAX_PENDING,
        description="records the collector's spool holds that the ledger has not yet taken",
    )


class ReplayCreate(StrictInput):
    request_id: str = Field(min_length=1, max_length=200)
    pool: str | None = Field(default=None, description="replay only on this pool")
    force: bool = Field(
        default=False, description="replay on `pool` even if it does not match: not_comparable"
    )


class CacheKeyRequest(StrictInput):
    endpoint: str = Field(description="/v1/completions or /v1/chat/completions")
    request: dict[str, Any] = Field(description="the OpenAI request body")
    fingerprint_id: str
    prompt_token_ids: list[int] | None = Field(
        default=None, description="completions: key the prompt by these token IDs"
    )


class CacheLookupRequest(StrictInput):
    endpoint: str = Field(description="/v1/completions or /v1/chat/completions")
    request: dict[str, Any] = Field(description="the OpenAI request body, as sent to vLLM")
    pool: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description="key under the fingerprint this pool's live workers serve",
    )
    fingerprint_id: str | None = Field(default=None, description="or key under this fingerprint")
    prompt_token_ids: list[int] | None = Field(
        default=None, description="completions: key the prompt by these token IDs"
    )


class CertifyCreate(StrictInput):
    pool: str = Field(min_length=1, max_length=100)
    prompts: int = Field(default=8, ge=1, le=256)
    concurrency: list[int] = Field(
        default=[1, 8, 32],
        min_length=1,
        max_length=8,
        **_stated(items={"type": "integer", "minimum": 1, "maximum": MAX_CONCURRENCY}),
    )
    max_tokens: list[int] = Field(
        default=[16, 128],
        min_length=1,
        max_length=8,
        **_stated(items={"type": "integer", "minimum": 1, "maximum": MAX_TOKENS}),
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1)


class ErasureCreate(StrictInput):
    reason: str = Field(min_length=1, max_length=1000, description="why (logged, signed)")


class RecordFilterInput(StrictInput):
    """A search filter, as ``GET /v1/records`` takes it (receive time for since/until)."""

    model: str | None = None
    fingerprint_id: str | None = None
    pool: str | None = None
    tier: int | None = Field(default=None, ge=0, le=2)
    since: str | None = Field(default=None, description="RFC 3339 with a zone")
    until: str | None = Field(default=None, description="RFC 3339 with a zone")


class BulkErasureCreate(StrictInput):
    filter: RecordFilterInput
    reason: str = Field(min_length=1, max_length=1000)
    dry_run: bool = Field(default=True, description="list what would be erased; write nothing")


class HoldCreate(StrictInput):
    request_id: str | None = Field(default=None, **_stated(pattern=REQUEST_ID_PATTERN))
    filter: RecordFilterInput | None = None
    reason: str = Field(min_length=1, max_length=1000)
