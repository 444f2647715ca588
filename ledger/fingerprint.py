"""Fingerprint documents: the environment that produced a record.

The fingerprint ID is ``sha256:`` + hex SHA-256 of the canonical body. The body excludes
per-machine identity, so identical workers share an ID. Collectors (``collectors/``) build the
full body; the ledger requires only the envelope of version 1:

    {"schema_version": 1, "model": {...}, ...any further sections...}
"""

from __future__ import annotations

from typing import Any

from ledger.canonical import digest_of
from ledger.errors import InvalidInput

FINGERPRINT_KIND = "fingerprint"
# The libraries a fingerprint's ``runtime`` section names, one field each (version or null).
RUNTIME_LIBRARIES = (
    "vllm",
    "torch",
    "torch_cuda",
    "transformers",
    "tokenizers",
    "triton",
    "flash_attn",
    "flashinfer",
    "xformers",
    "cuda_runtime",
    "cublas",
    "cudnn",
    "nccl",
)
FINGERPRINT_SCHEMA_VERSION = 1
_FORBIDDEN_IDENTITY = ("hostname", "worker_id", "gpu_uuid")


def fingerprint_id(body: dict[str, Any]) -> str:
    """The fingerprint's content ID."""
    return digest_of(body)


def validate_fingerprint_body(body: dict[str, Any]) -> str:
    """Validate a fingerprint body and return its ID."""
    version = body.get("schema_version")
    if type(version) is not int or version != FINGERPRINT_SCHEMA_VERSION:  # true is not 1
        raise InvalidInput(
            f"unsupported fingerprint schema_version {version!r}; this ledger reads "
            f"{FINGERPRINT_SCHEMA_VERSION}",
            code="unsupported_schema_version",
        )
    model = body.get("model")
    if not isinstance(model, dict) or not model:
        raise InvalidInput("fingerprint.model must be a non-empty object", code="schema_violation")
    for name in _FORBIDDEN_IDENTITY:
        if name in body:
            raise InvalidInput(
                f"fingerprint body must not hold per-machine identity ({name!r}); "
                "send it in the worker registration",
                code="schema_violation",
            )
    return fingerprint_id(body)
