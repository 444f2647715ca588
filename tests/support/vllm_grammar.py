"""The request grammar of vLLM's own OpenAI request models, as a golden file the fuzz test reads.

``tests/assets/vllm_request_fields.json`` lists, for ``/v1/completions`` and
``/v1/chat/completions``, every field of vLLM's pydantic request model with the JSON types its
schema accepts (``boolean``, ``integer``, ``number``, ``string``, ``array``, ``object``,
``null``, or ``ref`` for a nested model) and whether it is required. It is made by
:func:`dump` in vLLM's own environment (the collector never imports vLLM); a test compares it
with the installed vLLM, and ``LEDGER_REGEN_ASSETS=1`` rewrites it after a vLLM upgrade.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

ASSET = Path(__file__).resolve().parents[1] / "assets" / "vllm_request_fields.json"

_DUMP = """
import json
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

def types(schema):
    found = set()
    for option in schema.get("anyOf", [schema]):
        if "$ref" in option or "allOf" in option:
            found.add("ref")
        elif "type" in option:
            kind = option["type"]
            found.update(kind if isinstance(kind, list) else [kind])
        elif "const" in option or "enum" in option:
            found.add("string")
    return sorted(found)

out = {}
for path, model in (("/v1/completions", CompletionRequest),
                    ("/v1/chat/completions", ChatCompletionRequest)):
    schema = model.model_json_schema()
    required = set(schema.get("required", []))
    out[path] = {name: {"types": types(prop), "required": name in required}
                 for name, prop in sorted(schema["properties"].items())}
print("RESULT " + json.dumps(out, sort_keys=True))
"""


def dump(engine_python: str) -> dict[str, Any]:
    """The grammar of the vLLM installed beside ``engine_python``."""
    run = subprocess.run(
        [engine_python, "-c", _DUMP], capture_output=True, text=True, timeout=300, check=True
    )
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def load() -> dict[str, dict[str, dict[str, Any]]]:
    """The golden grammar: endpoint -> field -> {"types": [...], "required": bool}."""
    grammar: dict[str, dict[str, dict[str, Any]]] = json.loads(ASSET.read_text())
    return grammar


def write(grammar: dict[str, Any]) -> None:
    """One line per field, so a vLLM upgrade's diff reads field by field."""
    lines = ["{"]
    for i, (endpoint, fields) in enumerate(sorted(grammar.items())):
        lines.append(f"  {json.dumps(endpoint)}: {{")
        items = sorted(fields.items())
        for j, (name, spec) in enumerate(items):
            comma = "," if j < len(items) - 1 else ""
            lines.append(f"    {json.dumps(name)}: {json.dumps(spec, sort_keys=True)}{comma}")
        lines.append("  }" + ("," if i < len(grammar) - 1 else ""))
    lines.append("}")
    ASSET.write_text("\n".join(lines) + "\n")
