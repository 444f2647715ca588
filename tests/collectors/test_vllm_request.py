"""The collector reads request fields as vLLM 0.32's own request models do.

Each value below goes through the collector's judgement (``collectors.vllm_request``) and
through vLLM's pydantic models, in vLLM's environment (a subprocess: the collector never imports
vLLM). Where the collector reads a value, vLLM must read it the same; where the collector is
unsure, vLLM must refuse it, but for the few values listed in ``ACCEPTED_BUT_UNSURE`` (the
collector then sends the request on unchanged and counts vLLM's answer as unrecorded).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from collectors.vllm_request import Unsure, judge, prompt_kind
from tests.support.engine import engine_python

pytestmark = pytest.mark.engine

VALUES: list[Any] = [
    True, False, None, 0, 1, 2, -1, -2, 0.0, 1.0, 0.5, 1.5, 2**53 + 1, 2**63 - 1, 2**63,
    -(2**63), -(2**63) - 1, 1e300, "true", "false", "True", "FALSE", "0", "1", "yes", "no",
    "on", "off", "t", "f", "y", "n", "", " true", "2", "1.0", "0.5", " 1", "1e0", "+1", "-1",
    "01", "1.", "-0", " 0.7 ", "1_000", "inf", "nan", "Infinity", "0x1", "\uff11", "1,5", [],
    {}, [1], "9007199254740993",
]  # fmt: skip
FIELDS = {
    "completions": [
        "stream", "echo", "return_token_ids", "return_tokens_as_token_ids", "logprobs",
        "prompt_logprobs", "seed", "temperature",
    ],
    "chat": ["stream", "return_token_ids", "logprobs", "top_logprobs", "seed", "temperature"],
}  # fmt: skip
BASES: dict[str, dict[str, Any]] = {
    "completions": {"model": "m", "prompt": "x"},
    "chat": {"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True},
}
# Values vLLM reads that the collector does not try to: it forwards them unchanged.
ACCEPTED_BUT_UNSURE = {
    ("temperature", "1_000"), ("temperature", "inf"), ("temperature", "nan"),
    ("temperature", "Infinity"), ("seed", "1_000"),
}  # fmt: skip

VLLM_SIDE = """
import json, math, sys
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
models = {"completions": CompletionRequest, "chat": ChatCompletionRequest}
out = []
for endpoint, body, field in json.loads(sys.stdin.read()):
    try:
        value = getattr(models[endpoint].model_validate(body), field)
        out.append(["ok", value])
    except Exception:
        out.append(["err", None])
print("RESULT " + json.dumps(out))
"""


def _collector_reads(endpoint: str, body: dict[str, Any], field: str) -> Any:
    value = getattr(judge(endpoint == "chat", body), field)
    if (endpoint, field) == ("chat", "logprobs"):
        return value is not None  # the collector keeps chat's flag as 1 or None
    return value


FLAGS = {"stream", "echo", "return_token_ids", "return_tokens_as_token_ids"}


def test_the_collector_reads_fields_as_vllms_models_do():
    cases = [
        (endpoint, {**BASES[endpoint], field: value}, field)
        for endpoint, fields in FIELDS.items()
        for field in fields
        for value in VALUES
    ]
    run = subprocess.run(
        [engine_python(), "-c", VLLM_SIDE],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    verdicts = json.loads(line[len("RESULT ") :])
    disagreements = []
    for (endpoint, body, field), (verdict, vllm_value) in zip(cases, verdicts, strict=True):
        value = body[field]
        try:
            ours = _collector_reads(endpoint, body, field)
        except Unsure:
            if verdict == "ok" and (field, value) not in ACCEPTED_BUT_UNSURE:
                disagreements.append((endpoint, field, value, "unsure", vllm_value))
            continue
        if verdict != "ok":
            disagreements.append((endpoint, field, value, ours, "refused"))
        elif field in FLAGS or (endpoint, field) == ("chat", "logprobs"):
            if bool(vllm_value) != ours:
                disagreements.append((endpoint, field, value, ours, vllm_value))
        elif vllm_value != ours and not (
            field == "top_logprobs" and (vllm_value, ours) == (0, None)
        ):
            disagreements.append((endpoint, field, value, ours, vllm_value))
    assert disagreements == []


@pytest.mark.parametrize(
    ("prompt", "kind"),
    [("x", "one"), ([1, 2], "one"), (["a", "b"], "several"), ([[1], [2]], "several"),
     (["a"], "one"), ([[1, 2]], "one"),
     (None, None), ("", None), ([], None), ([1.0, 2.0], None), ([True], None), ([-1], None),
     ([1, "a"], None)],
)  # fmt: skip
def test_prompt_kinds(prompt: Any, kind: str | None):
    body = {"prompt": prompt} if prompt is not None else {}
    if kind is None:
        with pytest.raises(Unsure):
            prompt_kind(body)
    else:
        assert prompt_kind(body) == kind
