"""HTTP schemas (pydantic), for validation at the edge and for the OpenAPI document."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ErrorBody(BaseModel):
    code: str = Field(description="stable machine-readable code, e.g. record_conflict")
    message: str
    details: dict[str, Any] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=100)
    role: str = Field(description="collector | replayer")
    public_key: str = Field(description="PEM (SubjectPublicKeyInfo) or ed25519:<base64 raw>")


class KeyRevoke(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=1000)


class KeyPublic(BaseModel):
    key_id: str
    name: str
    role: str
    public_key: str
    registered_at: str
    log_index: int
    revoked: bool
    revoked_at: str | None
    revocation_reason: str | None


class KeyList(BaseModel):
    items: list[KeyPublic]


class FingerprintCreated(BaseModel):
    fingerprint_id: str
    status: str = Field(description="created | duplicate")
    log_index: int


class IngestItem(BaseModel):
    request_id: str
    status: str = Field(description="created | duplicate")
    log_index: int
    content_hash: str


class IngestResponse(BaseModel):
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
    "type": "object",
    "required": ["envelopes"],
    "properties": {"envelopes": {"type": "array", "items": ENVELOPE_SCHEMA}},
}

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 409, 413, 422, 503)
}
