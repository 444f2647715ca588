"""The engine's configuration: what the running vLLM server reports, plus its argv and env.

Values come, in order of trust, from what the server itself reports (``/version``,
``/v1/models``, the ``vllm:cache_config_info`` metric), then from the server process's command
line, then from nothing: a flag that was not given is recorded as ``"default"``, meaning the
built-in default of the engine version recorded beside it. ``batch_invariance`` is derived:

- ``kernel``: ``VLLM_BATCH_INVARIANT`` set to a non-zero integer (batch-invariant kernels);
- ``serial``: ``max_num_seqs`` 1 with prefix caching and chunked prefill off (every request runs
  alone, so batch composition cannot move its logits);
- ``none``: anything else, including an engine whose flags could not be read.

Per-machine values (host, port, local paths, the raw command line) go to ``identity``, never the
ID-bearing body; variables whose names name a secret (a last word TOKEN or ending in KEY,
FILE and PATH aside, or SECRET or PASSWORD anywhere) are dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from collectors import vllm_flags
from collectors.overrides import config_args, last_value, tokenizer
from collectors.procinfo import EngineProcess
from ledger.errors import Unreachable
from ledger.heartbeat import derive_invariance

DEFAULT = "default"
# engine.system_fingerprint when the engine runs with --fingerprint-mode custom
CUSTOM_FINGERPRINT = "custom"
# A name is a secret's when its last word (between _ or -, FILE or PATH aside) is one of these
# or ends in KEY (APIKEY), or when it holds SECRET or PASSWORD anywhere: VLLM_API_KEY,
# HF_TOKEN; not VLLM_FLASHINFER_MOE_MAX_NUM_TOKENS, which sets how kernels split work.
SECRET_WORDS = frozenset({"TOKEN", "PASSWD", "PWD", "CREDENTIALS", "AUTH"})
SECRET_PARTS = ("SECRET", "PASSWORD")
# VLLM_* variables that say where this machine keeps things, not how it computes.
IDENTITY_ENV = frozenset({"VLLM_HOST_IP", "VLLM_PORT", "VLLM_RPC_BASE_PATH"})
IDENTITY_ENV_SUFFIXES = ("_ROOT", "_DIR", "_PATH")
# Variables outside VLLM_* that change which kernels run or how they reduce.
EXTRA_ENV = frozenset(
    {
        "CUBLAS_WORKSPACE_CONFIG",
        "NVIDIA_TF32_OVERRIDE",
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
        "NCCL_ALGO",
        "NCCL_PROTO",
        "CUDA_DEVICE_ORDER",
    }
)

# flag -> (field, kind); kind "bool" flags also accept --no-<flag>. Short forms (-tp, -cc, ...)
# are read as their long names (vllm_flags.ALIASES). Every other flag but the deployment-only
# ones goes to the body's other_flags (vllm_flags).
FLAGS: dict[str, tuple[str, str]] = {
    "--dtype": ("dtype", "str"),
    "--quantization": ("quantization", "str"),
    "--kv-cache-dtype": ("kv_cache_dtype", "str"),
    "--tensor-parallel-size": ("tensor_parallel_size", "int"),
    "--pipeline-parallel-size": ("pipeline_parallel_size", "int"),
    "--data-parallel-size": ("data_parallel_size", "int"),
    "--max-num-seqs": ("max_num_seqs", "int"),
    "--max-num-batched-tokens": ("max_num_batched_tokens", "int"),
    "--max-model-len": ("max_model_len", "int"),
    "--block-size": ("block_size", "int"),
    "--enable-chunked-prefill": ("enable_chunked_prefill", "bool"),
    "--enable-prefix-caching": ("enable_prefix_caching", "bool"),
    "--enforce-eager": ("enforce_eager", "bool"),
    "--speculative-config": ("speculative_config", "str"),
    "--attention-backend": ("attention_backend", "str"),
    "--seed": ("seed", "str"),
    "--generation-config": ("generation_config", "str"),
    "--max-logprobs": ("max_logprobs", "int"),
    "--served-model-name": ("served_model_name", "list"),  # the first is the model's name
    "--tokenizer-mode": ("tokenizer_mode", "str"),
    # overrides of what the model directory says, and how kernels are compiled and captured
    "--override-generation-config": ("override_generation_config", "json"),
    "--hf-overrides": ("hf_overrides", "json"),
    "--compilation-config": ("compilation_config", "json"),
    "--optimization-level": ("optimization_level", "str"),  # also -O3, -O=3, -O 3
    "--cuda-graph-sizes": ("cuda_graph_sizes", "list"),
    "--max-seq-len-to-capture": ("max_seq_len_to_capture", "int"),
    "--cudagraph-capture-sizes": ("cudagraph_capture_sizes", "list"),
    "--max-cudagraph-capture-size": ("max_cudagraph_capture_size", "int"),
    # which kernels and implementations run, and how work is split and scheduled
    "--attention-config": ("attention_config", "json"),
    "--quantization-config": ("quantization_config", "json"),
    "--model-impl": ("model_impl", "str"),
    "--moe-backend": ("moe_backend", "str"),
    "--enable-expert-parallel": ("enable_expert_parallel", "bool"),
    "--disable-custom-all-reduce": ("disable_custom_all_reduce", "bool"),
    "--decode-context-parallel-size": ("decode_context_parallel_size", "int"),
    "--prefill-context-parallel-size": ("prefill_context_parallel_size", "int"),
    "--async-scheduling": ("async_scheduling", "bool"),
    "--scheduling-policy": ("scheduling_policy", "str"),
    "--long-prefill-token-threshold": ("long_prefill_token_threshold", "int"),
    "--enable-batch-sharded-sampling": ("enable_batch_sharded_sampling", "bool"),
    "--mamba-cache-dtype": ("mamba_cache_dtype", "str"),
    "--mamba-ssm-cache-dtype": ("mamba_ssm_cache_dtype", "str"),
    "--logits-processors": ("logits_processors", "list"),
    # what the OpenAI server does with a request or its answer: the prompt a chat template
    # renders, the tokens and logprobs it returns, how it splits the text
    "--default-chat-template-kwargs": ("default_chat_template_kwargs", "json"),
    "--chat-template-content-format": ("chat_template_content_format", "str"),
    "--trust-request-chat-template": ("trust_request_chat_template", "bool"),
    "--exclude-tools-when-tool-choice-none": ("exclude_tools_when_tool_choice_none", "bool"),
    "--response-role": ("response_role", "str"),
    "--reasoning-parser": ("reasoning_parser", "str"),
    "--logprobs-mode": ("logprobs_mode", "str"),
    "--enable-lora": ("enable_lora", "bool"),
    "--max-loras": ("max_loras", "int"),
    "--max-lora-rank": ("max_lora_rank", "int"),
}
FIELDS = (*dict.fromkeys(field for field, _ in FLAGS.values()), "tokenizer")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class EngineSnapshot:
    body: dict[str, Any]
    identity: dict[str, Any]
    # the flags the engine runs with: its --config file's, then its command line's (which win)
    argv: tuple[str, ...] = ()


def _is_secret(name: str) -> bool:
    upper = name.upper().replace("-", "_")
    if any(part in upper for part in SECRET_PARTS):
        return True
    words = [w for w in upper.split("_") if w]
    while len(words) > 1 and words[-1] in ("FILE", "PATH"):  # HF_TOKEN_PATH: where it is
        words.pop()
    # the last word names what the value is: VLLM_API_KEY, HF_TOKEN; not
    # VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD, a size that changes kernels
    return bool(words) and (words[-1] in SECRET_WORDS or words[-1].endswith("KEY"))


def _convert(value: str, kind: str, flag: str, unknown: dict[str, str]) -> Any:
    if kind == "json":  # a JSON value; vLLM also takes a bare level for -cc: kept as text
        try:
            return json.loads(value)
        except ValueError:
            if flag not in ("-cc", "--compilation-config"):
                unknown[flag] = f"{flag} {value!r} is not JSON"
            return value
    if kind == "int":
        try:
            return _human_int(value)
        except ValueError:
            unknown[flag] = f"{flag} {value!r} is not an integer"
            return None
    if kind == "bool":
        return value.lower() in ("1", "true", "yes", "on")
    return value


_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def _human_int(value: str) -> int:
    """An integer as vLLM 0.32 reads its size flags: ``8k`` is 8,000, ``8K`` 8,192 (whole
    numbers only with a binary suffix), ``auto`` and ``-1`` are -1; ValueError otherwise."""
    value = value.strip()
    if value.lower() == "auto":
        return -1
    found = _HUMAN_INT.fullmatch(value)
    if found is None:
        return int(value)
    number, suffix = found.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    return int(number) * (1 << (10 * ("KMGT".index(suffix) + 1)))


def _dotted_value(value: str, append: bool) -> Any:
    """The value of a ``--config-flag.key VALUE`` argument, as vLLM's parser reads it."""
    if append:  # --flag.key+ a,b: a list
        return value.split(",")
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return _human_int(value) if value.strip().lower() != "auto" else value
    except ValueError:
        return value


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = into[key] + value
        else:
            into[key] = value


_PYTHON = re.compile(r"(python|pypy)[0-9.]*t?")
_PYTHON_VALUED = frozenset({"--check-hash-based-pycs"})  # long interpreter options with a value


def engine_argv(argv: tuple[str, ...] | list[str]) -> list[str]:
    """The arguments vLLM's parser reads: ``argv`` without the program, or, when the program is
    a Python interpreter, without it, its own options (``-u``, ``-X utf8``, ``-Wignore``,
    clusters such as ``-um``) and the module (``-m``) or the code (``-c``) or the script.
    Arguments that start with ``-`` are never dropped unless they are the interpreter's, so
    applying it twice drops at most a positional (``serve``, the model), which vLLM's flags
    do not depend on."""
    args = list(argv)
    if not args or args[0].startswith("-"):
        return args
    if not _PYTHON.fullmatch(args[0].rsplit("/", 1)[-1]):
        return args[1:]
    i = 1
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        arg = args[i]
        if arg.startswith("--"):
            i += 2 if arg in _PYTHON_VALUED else 1
            continue
        for j, letter in enumerate(arg[1:], start=2):
            if letter in "mc":  # the module or the code: glued (-mvllm...) or the next argument
                return args[i + 1 :] if arg[j:] else args[i + 2 :]
            if letter in "WX":  # a value, glued (-Wignore) or the next argument
                i += 0 if arg[j:] else 1
                break
        i += 1
    return args[i + 1 :]


def parse_engine_args(argv: tuple[str, ...] | list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Engine fields given on the command line (last occurrence wins), and parse problems.

    As vLLM 0.32's parser reads them: ``-O3``, ``-O=3`` and ``-O 3`` set the optimization
    level; ``--compilation-config.mode 0`` (a member of a JSON flag, by dots, ``+`` appending a
    comma-separated list) merges into one object per flag that replaces the flag's plain value.
    A flag this collector does not interpret, unless it is deployment-only, is kept with its
    value in ``given["other_flags"]`` (present only when there is one).
    """
    given: dict[str, Any] = {}
    unknown: dict[str, str] = {}
    dotted: dict[str, dict[str, Any]] = {}
    other: dict[str, Any] = {}
    i = 0
    args = engine_argv(argv)
    while i < len(args):
        arg = args[i]
        if arg.startswith("-O") and arg != "-O" and not arg.startswith("-O."):
            given["optimization_level"] = arg[3:] if arg[2] == "=" else arg[2:]
            i += 1
            continue
        if arg == "-O" and i + 1 < len(args) and args[i + 1] in ("0", "1", "2", "3"):
            given["optimization_level"] = args[i + 1]
            i += 2
            continue
        name, eq, inline = arg.partition("=")
        if name.startswith("-") and "." in name:
            i = _dotted(args, i, name, eq, inline, dotted)
            continue
        name = name.replace("_", "-") if name.startswith("--") else name
        name = vllm_flags.ALIASES.get(name, name)
        negated = name.startswith("--no-")
        key = "--" + name[5:] if negated else name
        spec = FLAGS.get(key)
        if spec is None or (negated and spec[1] != "bool"):
            i = _other_flag(args, i, name, eq, inline, other) if name.startswith("-") else i + 1
            continue
        field, kind = spec
        if kind == "bool":
            if negated:
                given[field] = False
            elif eq:
                given[field] = _convert(inline, "bool", key, unknown)
            else:
                given[field] = True
            i += 1
            continue
        if kind == "list":  # nargs="+": the values up to the next flag
            values = [inline] if eq else []
            i += 1
            while not eq and i < len(args) and not args[i].startswith("-"):
                values.append(args[i])
                i += 1
            given[field] = values
            continue
        if eq:
            value = inline
            i += 1
        elif i + 1 < len(args):
            value = args[i + 1]
            i += 2
        else:
            unknown[key] = f"{key} has no value"
            i += 1
            continue
        given[field] = _convert(value, kind, key, unknown)
    names = given.get("served_model_name")
    if isinstance(names, list):  # vLLM answers with the first (the others are aliases)
        given["served_model_name"] = names[0] if names else None
    if isinstance(given.get("moe_backend"), str):  # vLLM: lower case, dashes as underscores
        given["moe_backend"] = given["moe_backend"].lower().replace("-", "_")
    for flag, members in dotted.items():
        flag = vllm_flags.ALIASES.get(flag, flag)
        spec = FLAGS.get(flag)
        if spec is not None and spec[1] == "json":
            given[spec[0]] = members
        elif flag not in vllm_flags.DEPLOYMENT_ONLY:
            other[flag] = SECRET_VALUE if _is_secret(flag.lstrip("-")) else _redacted(members)
    if other:
        given["other_flags"] = dict(sorted(other.items()))
    return given, unknown


SECRET_VALUE = "(a secret: not recorded)"


def _other_flag(
    args: list[str], i: int, name: str, eq: str, inline: str, into: dict[str, Any]
) -> int:
    """Reads a flag the collector does not interpret at ``args[i]``, with as many values as
    vLLM's parser gives it, into ``into`` (unless it is deployment-only); the next index."""
    value: Any
    switch_off = name.startswith("--no-") and name in vllm_flags.SWITCHES
    flag = "--" + name[5:] if switch_off else name
    i += 1
    if name in vllm_flags.SWITCHES:
        value = False if switch_off else (inline if eq else True)
    elif eq:  # argparse: an inline value is the list's only item
        value = [inline] if name in vllm_flags.LISTS else inline
    elif name in vllm_flags.LISTS:
        value = []
        while i < len(args) and not args[i].startswith("-"):
            value.append(args[i])
            i += 1
    elif name in vllm_flags.ONE_VALUE:
        value = args[i] if i < len(args) else None
        i += 1
    elif i < len(args) and not args[i].startswith("-"):
        # an optional value, or a flag vLLM 0.32 does not have: what follows is its value
        value = args[i]
        i += 1
    else:
        value = True
    if flag in vllm_flags.DEPLOYMENT_ONLY:
        return i
    value = SECRET_VALUE if _is_secret(flag.lstrip("-")) else _redacted(_json_or_text(value))
    if flag in vllm_flags.APPEND:
        into.setdefault(flag, []).append(value)
    else:
        into[flag] = value
    return i


def _json_or_text(value: Any) -> Any:
    """A JSON object or array given as text, parsed (so spacing and member order, or the same
    setting from a --config file, give one ID); any other value as it is."""
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, list):
        return [_json_or_text(v) for v in value]
    return value


_USERINFO = re.compile(r"(?<=://)[^/?#@\s]*@")


def _redacted(value: Any) -> Any:
    """``value`` without what may be a secret: a member whose name names one (at any depth:
    ``{"s3_secret_access_key": ...}``), and the user and password of a URL."""
    if isinstance(value, dict):
        return {k: SECRET_VALUE if _is_secret(str(k)) else _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    if isinstance(value, str):
        return _USERINFO.sub(SECRET_VALUE + "@", value)
    return value


def _dotted(
    args: list[str], i: int, name: str, eq: str, inline: str, into: dict[str, dict[str, Any]]
) -> int:
    """Reads ``--flag.a.b VALUE`` (or ``=VALUE``) at ``args[i]`` into ``into[--flag]``; the index
    of the next argument."""
    if name.startswith("--"):  # vLLM: dashes for underscores up to the first dot only
        head, _, rest = name[2:].partition(".")
        name = "--" + head.replace("_", "-") + "." + rest
    if eq:
        value, following = inline, i + 1
    elif i + 1 < len(args):
        value, following = args[i + 1], i + 2
    else:
        value, following = "", i + 1
    append = name.endswith("+")
    flag, *keys = name.removesuffix("+").split(".")
    member: Any = _dotted_value(value, append)
    for key in reversed(keys):
        member = {key: member}
    _merge(into.setdefault(flag, {}), member)
    return following


def redact_argv(argv: tuple[str, ...] | list[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("<redacted>")
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if name.startswith("-") and _is_secret(name):
            out.append(f"{name}=<redacted>" if eq else name)
            hide_next = not eq
        else:
            out.append(arg)
    return out


def split_env(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(numerics-relevant engine variables for the body, per-machine ones for identity)."""
    body: dict[str, str] = {}
    identity: dict[str, str] = {}
    for name in sorted(env):
        if not (name.startswith("VLLM_") or name in EXTRA_ENV) or _is_secret(name):
            continue
        if name in IDENTITY_ENV or name.endswith(IDENTITY_ENV_SUFFIXES):
            identity[name] = env[name]
        else:
            body[name] = env[name]
    return body, identity


def parse_info_metric(text: str, name: str) -> dict[str, str] | None:
    """Labels of the first sample of an ``*_info`` metric in Prometheus text format."""
    prefix = name + "{"
    for line in text.splitlines():
        if line.startswith(prefix):
            return {k: v.replace('\\"', '"') for k, v in _LABEL.findall(line)}
    return None


def _get(client: httpx.Client, url: str) -> httpx.Response:
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        raise Unreachable(
            f"the engine at {url} does not answer: {exc}", code="engine_unreachable"
        ) from exc
    return response


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def server_info(engine_url: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """What the running server says about itself; raises Unreachable if it does not answer.

    Only ``/v1/models`` is required; the version, the cache-config metric and the engine's own
    ``system_fingerprint`` (from a one-token completion) are reported as unknown when missing.
    """
    base = engine_url.rstrip("/")
    unknown: dict[str, str] = {}
    info: dict[str, Any] = {"unknown": unknown, "cache_config": None}
    with httpx.Client(timeout=timeout) as client:
        models = _get(client, f"{base}/v1/models")
        listed = _json(models) if models.status_code == 200 else None
        data = listed.get("data") if isinstance(listed, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise Unreachable(
                f"{base}/v1/models answered HTTP {models.status_code} without a model list; "
                "is this a vLLM server?",
                code="engine_unreachable",
            )
        info["model"] = data[0]
        try:
            version = client.get(f"{base}/version")
            found = _json(version)
            if version.status_code == 200 and isinstance(found, dict):
                info["version"] = found.get("version")
            else:
                unknown["version"] = f"/version answered HTTP {version.status_code}"
            metrics = client.get(f"{base}/metrics")
            if metrics.status_code == 200:
                info["cache_config"] = parse_info_metric(metrics.text, "vllm:cache_config_info")
            if info["cache_config"] is None:
                unknown["cache_config"] = "the server exports no vllm:cache_config_info metric"
            probe = client.post(
                f"{base}/v1/completions",
                json={"model": info["model"].get("id"), "prompt": "fingerprint", "max_tokens": 1},
            )
            answer = _json(probe)
            if probe.status_code == 200 and isinstance(answer, dict):
                info["system_fingerprint"] = answer.get("system_fingerprint")
            else:
                unknown["system_fingerprint"] = (
                    f"a one-token completion answered HTTP {probe.status_code}"
                )
        except httpx.HTTPError as exc:
            raise Unreachable(
                f"the engine at {base} stopped answering: {exc}", code="engine_unreachable"
            ) from exc
    return info


def _bool_label(labels: dict[str, str] | None, name: str) -> bool | None:
    if labels is None or name not in labels:
        return None
    return labels[name] == "True"


def snapshot_engine(
    engine_url: str | None,
    process: EngineProcess | None,
    process_reason: str | None = None,
    *,
    info: dict[str, Any] | None = None,
) -> EngineSnapshot:
    """The ``engine`` body and identity from the server (``info``) and its process."""
    unknown: dict[str, str] = {}
    identity: dict[str, Any] = {"url": engine_url}
    fields: dict[str, Any] = dict.fromkeys(FIELDS, DEFAULT)
    env_body: dict[str, str] | None = None
    other_flags: dict[str, Any] | None = None
    argv: tuple[str, ...] = ()
    if process is not None:
        from_file, file_problems = config_args(process)
        argv = (*from_file, *engine_argv(process.argv))  # the command line's own flags win
        given, problems = parse_engine_args(argv)
        other_flags = given.pop("other_flags", {})
        fields.update(given)
        unknown.update(file_problems)
        unknown.update(problems)
        fields["tokenizer"], tokenizer_identity, tokenizer_problems = tokenizer(process, argv)
        identity.update(tokenizer_identity)
        unknown.update(tokenizer_problems)
        env_body, env_identity = split_env(process.env)
        identity.update(pid=process.pid, argv=redact_argv(process.argv), env=env_identity)
    else:
        reason = process_reason or "the engine process was not inspected"
        for field in FIELDS:
            fields[field] = None
        unknown["flags"] = reason
        unknown["env"] = reason
    mode = last_value(argv, "--fingerprint-mode")
    if mode == "custom":  # the engine answers a label the operator chose (the ledger's ID)
        identity["system_fingerprint_value"] = (
            info.get("system_fingerprint") if info is not None else None
        )
    if info is None:
        unknown["server"] = (
            "no engine URL given; nothing was asked of the server"
            if engine_url is None
            else "the server was not queried"
        )
        version = system_fingerprint = None
    else:
        unknown.update({f"server.{k}": v for k, v in info["unknown"].items()})
        version = info.get("version")
        system_fingerprint = info.get("system_fingerprint")
        model = info["model"]
        fields["served_model_name"] = model.get("id")
        if model.get("max_model_len") is not None:
            fields["max_model_len"] = model["max_model_len"]
        identity["model_root"] = model.get("root")
        labels = info.get("cache_config")
        prefix = _bool_label(labels, "enable_prefix_caching")
        if prefix is not None:
            fields["enable_prefix_caching"] = prefix
        if labels is not None:
            if labels.get("cache_dtype"):
                fields["kv_cache_dtype"] = labels["cache_dtype"]
            if labels.get("block_size", "None") != "None":
                fields["block_size"] = int(labels["block_size"])
    body: dict[str, Any] = {
        "name": "vllm",
        "version": version,
        **fields,
        "other_flags": other_flags,
        "env": env_body,
        "batch_invariance": derive_invariance(fields, env_body),
        # in custom mode the answer is a label, not a description: kept out of the ID, which
        # the label names (CUSTOM_FINGERPRINT)
        "system_fingerprint": CUSTOM_FINGERPRINT if mode == "custom" else system_fingerprint,
        "unknown": unknown,
    }
    if process is None:
        body["unknown"]["batch_invariance"] = "engine flags unknown; assumed none"
    return EngineSnapshot(body, identity, argv)


def engine_port(engine_url: str) -> tuple[str, int]:
    parts = urlsplit(engine_url)
    if parts.hostname is None:
        raise ValueError(f"engine URL {engine_url!r} has no host")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
