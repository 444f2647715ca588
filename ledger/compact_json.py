"""JSON as vLLM writes it: compact separators, raw UTF-8 (not for signatures or digests:
those come from ``ledger.canonical``)."""

from __future__ import annotations

import json
from typing import Any


def compact_json(value: Any) -> bytes:
    """``value`` as vLLM's server and its OpenAI clients write JSON."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
