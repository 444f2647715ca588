"""Server-side overrides in the engine's fingerprint: the JSON-valued and compilation flags,
a --config YAML, --chat-template and --tokenizer, read through the engine's /proc entries (the
test's own process stands in for the engine: its /proc/PID/root is this filesystem)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from collectors.artifacts import model_section
from collectors.engine import SECRET_VALUE, parse_engine_args, snapshot_engine
from collectors.overrides import chat_template, config_args, engine_path, last_value, tokenizer
from collectors.procinfo import EngineProcess
from ledger.fingerprint_diff import diff


def engine(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None):
    return EngineProcess(
        os.getpid(), ("vllm", "serve", "/model", *argv), env or {}, None, str(cwd) if cwd else None
    )


def test_json_and_compilation_flags_are_values_in_the_body() -> None:
    given, unknown = parse_engine_args(
        [
            "--override-generation-config",
            '{"temperature": 0.5, "top_p": 0.9}',
            '--hf-overrides={"rope_scaling": {"factor": 2}}',
            "-O3",
            "--cuda-graph-sizes",
            "1",
            "2",
            "4",
            "--max-seq-len-to-capture",
            "4096",
            "--enforce-eager",
        ]
    )
    assert given["override_generation_config"] == {"temperature": 0.5, "top_p": 0.9}
    assert given["hf_overrides"] == {"rope_scaling": {"factor": 2}}
    assert given["optimization_level"] == "3"  # vLLM 0.32: -O3 is --optimization-level 3
    assert given["cuda_graph_sizes"] == ["1", "2", "4"]
    assert given["max_seq_len_to_capture"] == 4096 and given["enforce_eager"] is True
    assert unknown == {}
    given, unknown = parse_engine_args(["--hf-overrides", "{not json"])
    assert given["hf_overrides"] == "{not json"
    assert "is not JSON" in unknown["--hf-overrides"]
    given, _ = parse_engine_args(
        ["--compilation-config", '{"level": 3, "cudagraph_capture_sizes": [1, 2]}']
    )
    assert given["compilation_config"] == {"level": 3, "cudagraph_capture_sizes": [1, 2]}
    for argv in (["-O=2"], ["-O", "2"], ["--optimization-level", "2"]):
        assert parse_engine_args(argv)[0] == {"optimization_level": "2"}
    assert parse_engine_args(["-cc", '{"mode": 0}'])[0] == {"compilation_config": {"mode": 0}}


def test_members_of_a_json_flag_given_by_dots_are_read_as_vllm_reads_them() -> None:
    """vLLM 0.32 merges ``--flag.member VALUE`` arguments into one JSON object per flag (which
    replaces the flag's plain value): a collector that skipped them recorded "default" for an
    engine whose CUDA graphs, RoPE or attention kernels were changed."""
    given, unknown = parse_engine_args(
        [
            "--compilation-config",
            '{"mode": 3}',
            "--compilation-config.cudagraph_mode",
            "none",
            "--compilation_config.pass_config.fuse_allreduce_rms=false",
            "--hf-overrides.rope_theta",
            "500000",
            "-ac.use_trtllm_attention",
            "0",
            "--compilation-config.cudagraph_capture_sizes+",
            "1,2",
        ]
    )
    assert given == {
        "compilation_config": {
            "cudagraph_mode": "none",
            "pass_config": {"fuse_allreduce_rms": False},
            "cudagraph_capture_sizes": ["1", "2"],
        },
        "hf_overrides": {"rope_theta": 500000},
        "attention_config": {"use_trtllm_attention": 0},
    }
    assert unknown == {}
    base = snapshot_engine(None, engine([])).body
    for argv in (["--compilation-config.cudagraph_mode", "none"], ["-cc.mode", "0"]):
        assert snapshot_engine(None, engine(argv)).body != base
    # a dotted member of a flag the collector does not interpret is kept with its value
    given, unknown = parse_engine_args(["--kv-transfer-config.kv_role", "kv_both"])
    assert given == {"other_flags": {"--kv-transfer-config": {"kv_role": "kv_both"}}}
    assert unknown == {}


def test_flags_that_choose_kernels_or_split_work_are_in_the_body() -> None:
    base = snapshot_engine(None, engine([])).body
    for argv in (
        ["--model-impl", "transformers"],
        ["--disable-custom-all-reduce"],
        ["--async-scheduling"],
        ["--attention-config", '{"backend": "FLASHINFER"}'],
        ["--moe-backend", "triton"],
        ["-ep"],
        ["--logits-processors", "my.Processor"],
    ):
        changed = snapshot_engine(None, engine(argv)).body
        assert changed != base, argv
        assert diff({"engine": base}, {"engine": changed}), argv


def test_every_flag_the_collector_does_not_interpret_is_in_the_body() -> None:
    """vLLM 0.32 has about 430 options; one the collector has no field for still changes the
    ID (with its value, read with as many arguments as vLLM's parser gives it), unless it only
    says where the server listens, what it logs or where it downloads."""
    base = snapshot_engine(None, engine([])).body
    assert base["other_flags"] == {}
    cases = {
        ("--use-fp64-gumbel",): {"--use-fp64-gumbel": True},
        ("--no-enable-dbo",): {"--enable-dbo": False},
        ("--num-gpu-blocks-override", "100"): {"--num-gpu-blocks-override": "100"},
        ("--revision", "abc", "--tokenizer-revision", "t1"): {
            "--revision": "abc",
            "--tokenizer-revision": "t1",
        },
        ("--lora-modules", "a=/x", "b=/y", "--enforce-eager"): {"--lora-modules": ["a=/x", "b=/y"]},
        ("--lora-modules=a=/x",): {"--lora-modules": ["a=/x"]},
        ("-dpb", "ray"): {"--data-parallel-backend": "ray"},
        ("--data_parallel_backend=ray",): {"--data-parallel-backend": "ray"},
        ("--kernel-config.linear_backend", "x"): {"--kernel-config": {"linear_backend": "x"}},
        ("--middleware", "a.B", "--middleware", "c.D"): {"--middleware": ["a.B", "c.D"]},
        ("--a-flag-of-a-later-vllm", "v"): {"--a-flag-of-a-later-vllm": "v"},
        ("--a-later-secret-token", "hunter2"): {"--a-later-secret-token": SECRET_VALUE},
    }
    for argv, other in cases.items():
        body = snapshot_engine(None, engine(list(argv))).body
        assert body["other_flags"] == other, argv
        assert "hunter2" not in json.dumps(body)
        assert diff({"engine": base}, {"engine": body}), argv
    # what may be a secret is never in the body, whatever the flag's name
    for argv in (
        ["--model-loader-extra-config", '{"s3_secret_access_key": "hunter2", "n": 1}'],
        ["--tool-server", "https://user:hunter2@tools.example/mcp"],
        ["--a-later-secret-token.value", "hunter2"],
        ["--kv-transfer-config.auth.password", "hunter2"],
    ):
        body = snapshot_engine(None, engine(argv)).body
        assert "hunter2" not in json.dumps(body), argv
        assert SECRET_VALUE in json.dumps(body), argv
    # a JSON value is read as JSON: spacing and order do not change the ID
    spaced = snapshot_engine(None, engine(["--kernel-config", '{"b": 1, "a": 2}'])).body
    tight = snapshot_engine(None, engine(["--kernel-config", '{"a":2,"b":1}'])).body
    assert spaced == tight and spaced["other_flags"] == {"--kernel-config": {"a": 2, "b": 1}}
    # a list given inline is the list of one item, as given apart: one ID
    inline = snapshot_engine(None, engine(["--lora-modules=a=/x"])).body
    apart = snapshot_engine(None, engine(["--lora-modules", "a=/x"])).body
    assert inline == apart
    # the flag that takes a value swallows it, a switch does not
    given, _ = parse_engine_args(["--api-key", "k1", "k2", "--max-num-seqs", "1"])
    assert given == {"max_num_seqs": 1}
    given, _ = parse_engine_args(["--use-fp64-gumbel", "--max-num-seqs", "2"])
    assert given == {"max_num_seqs": 2, "other_flags": {"--use-fp64-gumbel": True}}
    # where it listens, what it logs, where it downloads: the same engine
    deployment = [
        *("--host", "0.0.0.0", "--port", "9000", "--api-key", "s3cret", "--enable-log-requests"),
        *("--uvicorn-log-level", "debug", "--download-dir", "/d", "--hf-token", "hf_x", "-asc"),
        *("4", "--disable-log-stats", "--otlp-traces-endpoint", "http://t:4317", "-dpl", "2"),
        *("--device-ids", "0,1"),
    ]
    assert snapshot_engine(None, engine(deployment)).body == base
    # the interpreter's own options are not the engine's, in any spelling
    tp2 = snapshot_engine(None, engine(["-tp", "2", "--enforce-eager"])).body
    for interpreter in (
        ("/usr/bin/python3.11", "-X", "utf8", "-u", "-m", "vllm.entrypoints.openai.api_server"),
        ("python3", "-mvllm.entrypoints.openai.api_server"),
        ("python3.13t", "-um", "vllm.entrypoints.openai.api_server"),
        ("pypy3", "-Wignore", "--check-hash-based-pycs", "always", "-m", "vllm.x"),
        ("/opt/venv/bin/python", "-c", "import vllm", "serve"),
        ("/opt/venv/bin/vllm", "serve", "/model"),
    ):
        argv = (*interpreter, "-tp", "2", "--enforce-eager")
        process = EngineProcess(os.getpid(), argv, {}, None, None)
        assert snapshot_engine(None, process).body == tp2, interpreter


@pytest.mark.parametrize(
    ("value", "mode"),
    [("1", "kernel"), (" 1", "kernel"), ("2", "kernel"), ("0", "none"), ("true", "none")],
)
def test_batch_invariance_reads_the_variable_as_vllm_does(value: str, mode: str) -> None:
    """vLLM reads VLLM_BATCH_INVARIANT as bool(int(value)); "true" stops it from starting."""
    body = snapshot_engine(None, engine([], env={"VLLM_BATCH_INVARIANT": value})).body
    assert body["batch_invariance"] == mode


def test_sizes_are_read_as_vllm_reads_them() -> None:
    """vLLM 0.32 reads its size flags with suffixes (8k is 8,000, 8K 8,192, auto -1)."""
    given, unknown = parse_engine_args(
        [
            "--max-num-batched-tokens",
            "8k",
            "--max-model-len",
            "32K",
            "--max-num-seqs",
            "auto",
            "--compilation-config.max_cudagraph_capture_size",
            "1k",
            "--moe-backend",
            "Flashinfer-CUTLASS",
        ]
    )
    assert unknown == {}
    assert given["max_num_batched_tokens"] == 8000 and given["max_model_len"] == 32768
    assert given["max_num_seqs"] == -1
    assert given["compilation_config"] == {"max_cudagraph_capture_size": 1000}
    assert given["moe_backend"] == "flashinfer_cutlass"
    assert parse_engine_args(["--max-num-seqs", "1.5K"])[1]  # vLLM refuses it too


def test_variables_that_change_kernels_are_in_the_body_and_secrets_are_not() -> None:
    env = {
        "NVIDIA_TF32_OVERRIDE": "0",
        "NCCL_ALGO": "Ring",
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1",
        "VLLM_FLASHINFER_MOE_MAX_NUM_TOKENS": "8192",  # TOKENS: a size, not a secret
        "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD": "1024",  # nor a TOKEN before other words
        "VLLM_API_KEY": "s3cret",
        "HF_TOKEN_PATH": "/secrets/hf",
        "HF_TOKEN": "s3cret",
        "VLLM_APIKEY": "s3cret",
        "MY_PASSWORD_FILE": "/x",
    }
    body = snapshot_engine(None, engine([], env=env)).body
    assert body["env"] == {
        "NCCL_ALGO": "Ring",
        "NVIDIA_TF32_OVERRIDE": "0",
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1",
        "VLLM_FLASHINFER_MOE_MAX_NUM_TOKENS": "8192",
        "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD": "1024",
    }


def test_flags_that_change_what_the_server_answers_are_in_the_body() -> None:
    """Flags of vLLM's OpenAI server that change the prompt a chat renders, the tokens or
    logprobs returned or the message's shape: two engines that differ in one of them have two
    fingerprints, so neither's records answer the other's cache lookups."""
    given, unknown = parse_engine_args(
        [
            "--default-chat-template-kwargs",
            '{"enable_thinking": false}',
            "--chat-template-content-format=openai",
            "--trust-request-chat-template",
            "--exclude-tools-when-tool-choice-none",
            "--response-role",
            "bot",
            "--reasoning-parser",
            "qwen3",
            "--logprobs-mode",
            "processed_logprobs",
            "--enable-lora",
            "--max-loras",
            "4",
        ]
    )
    assert unknown == {}
    assert given == {
        "default_chat_template_kwargs": {"enable_thinking": False},
        "chat_template_content_format": "openai",
        "trust_request_chat_template": True,
        "exclude_tools_when_tool_choice_none": True,
        "response_role": "bot",
        "reasoning_parser": "qwen3",
        "logprobs_mode": "processed_logprobs",
        "enable_lora": True,
        "max_loras": 4,
    }


def test_last_value_and_where_a_path_is_read(tmp_path: Path) -> None:
    assert last_value(["--x", "1", "--x=2"], "--x") == "2"
    assert last_value(["--chat_template", "t"], "--chat-template") == "t"
    assert last_value(["--x"], "--x") is None
    proc = engine([], cwd=tmp_path)
    pid = str(os.getpid())
    assert engine_path(proc, "/etc/t.jinja")[0] == Path("/proc", pid, "root", "etc/t.jinja")
    assert engine_path(proc, "t.jinja")[0] == Path("/proc", pid, "cwd", "t.jinja")


def test_a_config_file_sets_flags_the_command_line_overrides(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(
        "max_num_seqs: 1\nenable-prefix-caching: false\nenable_chunked_prefill: false\n"
        "hf_overrides: {max_position_embeddings: 2048}\ndtype: float16\n"
    )
    serial = snapshot_engine(None, engine(["--config", str(config)])).body
    assert serial["max_num_seqs"] == 1 and serial["enable_prefix_caching"] is False
    assert serial["hf_overrides"] == {"max_position_embeddings": 2048}
    assert serial["dtype"] == "float16"
    assert serial["batch_invariance"] == "serial"
    assert "config_file" not in serial["unknown"]
    # the command line's own flags win over the file's, wherever they stand
    overridden = snapshot_engine(
        None, engine(["--max-num-seqs", "8", "--config", str(config)])
    ).body
    assert overridden["max_num_seqs"] == 8 and overridden["batch_invariance"] == "none"
    # relative to the engine's working directory
    relative = snapshot_engine(None, engine(["--config", "serve.yaml"], cwd=tmp_path)).body
    assert relative["max_num_seqs"] == 1


@pytest.mark.parametrize(
    "content, reason",
    [
        (None, "cannot be read"),
        ("[1, 2]", "not a mapping"),
        ("a: [unclosed", "not YAML"),
    ],
)
def test_a_config_file_that_cannot_be_read_is_reported(
    tmp_path: Path, content: str | None, reason: str
) -> None:
    path = tmp_path / "serve.yaml"
    if content is not None:
        path.write_text(content)
    args, unknown = config_args(engine(["--config", str(path)]))
    assert args == [] and reason in unknown["config_file"]
    body = snapshot_engine(None, engine(["--config", str(path)])).body
    assert reason in body["unknown"]["config_file"]


def test_a_chat_template_override_replaces_the_directorys(tmp_path: Path) -> None:
    template = tmp_path / "tool_chat.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    found, identity, reason = chat_template(engine([]), ["--chat-template", str(template)])
    assert reason is None
    assert found == {
        "source": "--chat-template",
        "digest": "sha256:" + hashlib.sha256(template.read_bytes()).hexdigest(),
    }
    assert identity == {"chat_template_path": str(template)}
    inline = "{{ messages[0].content }}"
    found, identity, reason = chat_template(engine([]), ["--chat-template", inline])
    assert found is not None and found["source"] == "--chat-template (inline)"
    assert found["digest"] == "sha256:" + hashlib.sha256(inline.encode()).hexdigest()
    assert chat_template(engine([]), []) == (None, {}, None)
    # a path the collector cannot read: the digest is unknown, never the path's own
    gone = str(tmp_path / "missing.jinja")
    found, identity, reason = chat_template(engine([]), ["--chat-template", gone])
    assert found == {"source": "--chat-template", "digest": None}
    assert identity == {"chat_template_path": gone} and "cannot be read" in reason


def test_a_tokenizer_override_is_digested_like_the_models_own(tmp_path: Path) -> None:
    directory = tmp_path / "tok"
    directory.mkdir()
    (directory / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (directory / "tokenizer_config.json").write_text("{}")
    (directory / "README.md").write_text("not a tokenizer file")
    value, identity, unknown = tokenizer(engine([]), ["--tokenizer", str(directory)])
    digests = {
        name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
        for name in ("tokenizer.json", "tokenizer_config.json")
    }
    sizes = {name: (directory / name).stat().st_size for name in digests}
    same_files = model_section(directory, digests, sizes)["tokenizer_digest"]
    assert value == {"digest": same_files}
    assert identity == {"tokenizer_path": str(directory)} and unknown == {}
    assert tokenizer(engine([]), ["--tokenizer", "org/tokenizer"])[0] == {
        "repository": "org/tokenizer"
    }
    assert tokenizer(engine([]), [])[0] == "default"
    missing = tokenizer(engine([]), ["--tokenizer", str(tmp_path / "gone")])
    assert missing[0] is None and "cannot be read" in missing[2]["tokenizer"]
    body = snapshot_engine(None, engine(["--tokenizer", str(directory)])).body
    assert body["tokenizer"] == {"digest": same_files}


def test_a_tokenizer_directorys_chat_template_is_the_one_in_the_body(tmp_path: Path) -> None:
    """The engine renders chat prompts with the template of the tokenizer it loads: two
    --tokenizer directories that differ only in their template gave one fingerprint."""
    found = {}
    for name, text in (("a", "{{ messages[0].content }}"), ("b", "EVIL {{ messages }}")):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
        (directory / "chat_template.jinja").write_text(text)
        template, identity, reason = chat_template(engine([]), ["--tokenizer", str(directory)])
        assert reason is None and identity == {}
        assert template == {
            "source": "--tokenizer chat_template.jinja",
            "digest": "sha256:" + hashlib.sha256(text.encode()).hexdigest(),
        }
        found[name] = template
    assert found["a"] != found["b"]
    # a template in the tokenizer's config; --chat-template still wins over both
    config = tmp_path / "c"
    config.mkdir()
    (config / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    template, _, _ = chat_template(engine([]), ["--tokenizer", str(config)])
    assert template is not None and template["source"] == "--tokenizer tokenizer_config.json"
    given = tmp_path / "given.jinja"
    given.write_text("{{ messages }}!")
    template, _, _ = chat_template(
        engine([]), ["--tokenizer", str(config), "--chat-template", str(given)]
    )
    assert template is not None and template["source"] == "--chat-template"
    # vLLM never falls back to the model directory's template: a tokenizer directory without
    # one, or a repository, makes the template unknown (and chat requests uncacheable)
    bare = tmp_path / "bare"
    bare.mkdir()
    for value, why in ((str(bare), "carries no chat template"), ("org/tok", "names no directory")):
        template, _, reason = chat_template(engine([]), ["--tokenizer", value])
        assert template == {"source": "--tokenizer", "digest": None}
        assert reason is not None and why in reason
    assert chat_template(engine([]), []) == (None, {}, None)


def test_each_override_has_its_replay_impact() -> None:
    base = snapshot_engine(None, engine([])).body
    changed = snapshot_engine(
        None,
        engine(
            [
                "--hf-overrides",
                json.dumps({"num_hidden_layers": 2}),
                "--override-generation-config",
                '{"temperature": 0}',
                "-O",
                "0",
                "-cc",
                '{"mode": 0}',
                "--tokenizer",
                "org/other",
            ]
        ),
    ).body
    impacts = {d.path: d.impact for d in diff({"engine": base}, {"engine": changed})}
    assert "not comparable" in impacts["engine.hf_overrides"]
    assert "generation defaults" in impacts["engine.override_generation_config"]
    assert "CUDA graph" in impacts["engine.compilation_config"]
    assert "CUDA graph" in impacts["engine.optimization_level"]
    assert "tokenize" in impacts["engine.tokenizer"]


def _info(system_fingerprint: str) -> dict:
    return {
        "unknown": {},
        "model": {"id": "fixture", "max_model_len": 64},
        "version": "0.32.0",
        "cache_config": None,
        "system_fingerprint": system_fingerprint,
    }


def test_a_custom_system_fingerprint_is_a_label_kept_out_of_the_id() -> None:
    """Under --fingerprint-mode custom the engine answers the value it was given (the ledger's
    fingerprint ID): the body says "custom", so the ID does not depend on the label naming it,
    and the collector expects the ID itself on every response."""
    from collectors.collector import expected_system_fingerprint
    from collectors.snapshot import Snapshot

    bodies = []
    for value in ("sha256:" + "1" * 64, "sha256:" + "2" * 64):
        argv = ["--fingerprint-mode", "custom", "--fingerprint-value", value]
        snap = snapshot_engine("http://127.0.0.1:8000", engine(argv), info=_info(value))
        assert snap.body["system_fingerprint"] == "custom"
        assert snap.identity["system_fingerprint_value"] == value
        bodies.append(snap.body)
    assert bodies[0] == bodies[1]
    full = snapshot_engine("http://127.0.0.1:8000", engine([]), info=_info("vllm-0.32.0-ab12cd34"))
    assert full.body["system_fingerprint"] == "vllm-0.32.0-ab12cd34"

    def snapshot_of(engine_body: dict) -> Snapshot:
        return Snapshot({"engine": engine_body}, {}, None, "sha256:" + "f" * 64)  # type: ignore[arg-type]

    assert expected_system_fingerprint(snapshot_of(bodies[0])) == "sha256:" + "f" * 64
    assert expected_system_fingerprint(snapshot_of(full.body)) == "vllm-0.32.0-ab12cd34"
    assert expected_system_fingerprint(snapshot_of({"system_fingerprint": None})) is None
