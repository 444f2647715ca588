"""JSON as vLLM writes it: compact separators, raw UTF-8 (not for signatures or digests:
those come from ``ledger.canonical``).

vLLM's server writes its answers with pydantic-core, whose float text is the shortest that
round-trips, written as ``0.00001`` and ``1e+16``; orjson writes floats the same way (Python's
``json`` would write ``1e-05``, which vLLM never sends). orjson is also about fifteen times
faster, which matters on the collector's path, where every streamed chunk is re-encoded.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def compact_json(value: Any) -> bytes:
    """``value`` as vLLM's server and its OpenAI clients write JSON."""
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer beyond 64 bits, which orjson refuses: every digit kept
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
