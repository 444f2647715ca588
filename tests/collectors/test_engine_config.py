"""Engine flags, environment and batch invariance, from argv/env without a server."""

from __future__ import annotations

import pytest

from collectors.engine import (
    DEFAULT,
    parse_engine_args,
    parse_info_metric,
    redact_argv,
    snapshot_engine,
    split_env,
)
from collectors.procinfo import EngineProcess
from ledger.fingerprint_diff import diff
from ledger.heartbeat import derive_invariance

BASE = ("python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m")


def process(*args: str, env: dict[str, str] | None = None) -> EngineProcess:
    return EngineProcess(4242, (*BASE, *args), env or {}, "/usr/bin/python3", "/srv")


def test_flags_in_every_spelling():
    given, unknown = parse_engine_args(
        [
            *BASE,
            "--max-num-seqs=1",
            "--no-enable-prefix-caching",
            "--enable_chunked_prefill",
            "false",  # not a value of the boolean flag: a positional, ignored
            "-tp",
            "2",
            "--dtype",
            "float32",
            "--seed",
            "18446744073709551615",
        ]
    )
    assert given == {
        "max_num_seqs": 1,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": True,
        "tensor_parallel_size": 2,
        "dtype": "float32",
        "seed": "18446744073709551615",
    }
    assert unknown == {}


def test_last_flag_wins_and_problems_are_reported():
    given, unknown = parse_engine_args(
        [*BASE, "--max-num-seqs", "4", "--max-num-seqs", "x", "--config", "c.yaml", "--dtype"]
    )
    assert given["max_num_seqs"] is None
    assert "not an integer" in unknown["--max-num-seqs"]
    assert (
        "config_file" not in unknown
    )  # the file is read (tests/collectors/test_engine_overrides.py)
    assert unknown["--dtype"] == "--dtype has no value"


def test_secrets_never_leave_the_process():
    argv = redact_argv([*BASE, "--api-key", "s3cret", "--hf-token=abc", "--port", "8000"])
    assert "s3cret" not in argv and "abc" not in " ".join(argv)
    assert argv[-4:] == ["<redacted>", "--hf-token=<redacted>", "--port", "8000"]
    body, identity = split_env(
        {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_API_KEY": "k",
            "HF_TOKEN": "t",
            "VLLM_HOST_IP": "10.0.0.7",
            "VLLM_CACHE_ROOT": "/var/cache",
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
            "PATH": "/usr/bin",
        }
    )
    assert body == {"VLLM_CPU_KVCACHE_SPACE": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert identity == {"VLLM_HOST_IP": "10.0.0.7", "VLLM_CACHE_ROOT": "/var/cache"}


@pytest.mark.parametrize(
    ("fields", "env", "expected"),
    [
        ({"max_num_seqs": 1}, {"VLLM_BATCH_INVARIANT": "1"}, "kernel"),
        (
            {"max_num_seqs": 1, "enable_prefix_caching": False, "enable_chunked_prefill": False},
            {},
            "serial",
        ),
        (
            {"max_num_seqs": 1, "enable_prefix_caching": False, "enable_chunked_prefill": DEFAULT},
            {},
            "none",
        ),
        (
            {"max_num_seqs": 2, "enable_prefix_caching": False, "enable_chunked_prefill": False},
            {},
            "none",
        ),
        ({"max_num_seqs": DEFAULT}, None, "none"),
    ],
)
def test_batch_invariance(fields: dict, env: dict | None, expected: str):
    assert derive_invariance(fields, env) == expected


def test_info_metric_labels():
    text = (
        "# HELP vllm:cache_config_info x\n"
        'vllm:cache_config_info{block_size="128",cache_dtype="auto",'
        'enable_prefix_caching="False",note="a \\"quoted\\" word"} 1.0\n'
    )
    labels = parse_info_metric(text, "vllm:cache_config_info")
    assert labels == {
        "block_size": "128",
        "cache_dtype": "auto",
        "enable_prefix_caching": "False",
        "note": 'a "quoted" word',
    }
    assert parse_info_metric(text, "vllm:other_info") is None


def test_server_reports_override_flags_and_identity_stays_out_of_the_body():
    info = {
        "unknown": {},
        "version": "0.32.0",
        "system_fingerprint": "vllm-0.32.0-083aad30",
        "model": {"id": "fixture", "max_model_len": 256, "root": "/models/m"},
        "cache_config": {
            "enable_prefix_caching": "False",
            "cache_dtype": "auto",
            "block_size": "128",
        },
    }
    snap = snapshot_engine(
        "http://127.0.0.1:8000",
        process(
            "--enable-prefix-caching",
            "--max-num-seqs",
            "1",
            "--no-enable-chunked-prefill",
            env={"VLLM_HOST_IP": "10.1.1.1"},
        ),
        info=info,
    )
    body = snap.body
    assert body["enable_prefix_caching"] is False  # what the server runs with, not the flag
    assert body["batch_invariance"] == "serial"
    assert body["max_model_len"] == 256 and body["block_size"] == 128
    assert body["version"] == "0.32.0" and body["system_fingerprint"].startswith("vllm-")
    assert body["max_logprobs"] == DEFAULT
    assert "10.1.1.1" not in str(body) and "/models/m" not in str(body)
    assert snap.identity["pid"] == 4242 and snap.identity["env"] == {"VLLM_HOST_IP": "10.1.1.1"}


def test_without_the_process_flags_are_unknown_with_the_reason():
    snap = snapshot_engine(
        "http://10.0.0.9:8000", None, "the engine (10.0.0.9) is not on this host"
    )
    assert snap.body["max_num_seqs"] is None and snap.body["env"] is None
    assert "not on this host" in snap.body["unknown"]["flags"]
    assert snap.body["batch_invariance"] == "none"
    assert "assumed none" in snap.body["unknown"]["batch_invariance"]
    assert snap.body["unknown"]["server"] == "the server was not queried"
    assert snap.body["version"] is None and snap.body["system_fingerprint"] is None


def test_dtype_alone_changes_exactly_one_cause():
    a = {"engine": snapshot_engine(None, process("--dtype", "bfloat16")).body}
    b = {"engine": snapshot_engine(None, process("--dtype", "float32")).body}
    changes = diff(a, b)
    assert [(c.path, c.before, c.after) for c in changes] == [
        ("engine.dtype", "bfloat16", "float32")
    ]
    assert "not comparable" in changes[0].impact
