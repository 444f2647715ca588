"""Server-side overrides an engine was started with that live in files: what its ``--config``
YAML sets, the chat template ``--chat-template`` names, the tokenizer ``--tokenizer`` names.

Files are read as the engine sees them: an absolute path under ``/proc/PID/root`` (the engine's
filesystem, also from a sidecar container that shares its PID namespace), a relative one under
``/proc/PID/cwd``; when those cannot be read, the same path in the collector's filesystem.
What cannot be read is reported, never guessed.

- ``--config FILE``: vLLM reads the YAML mapping as flags placed before the command line's own,
  which win; :func:`config_args` gives them as argv (``key: true`` is ``--key``, ``false``
  ``--no-key``, a mapping or list its JSON).
- ``--chat-template``: a file's content, or else the value's when it holds a Jinja character
  (vLLM then takes the value as the template); the digest replaces the model directory's template
  in the fingerprint (:func:`chat_template`), so cache keys of chat requests follow the
  template the engine really applies.
- ``--tokenizer``: a directory's tokenizer files, digested as the model section digests the
  model's own (an override naming the same files gives the same digest), or else the value as
  a Hugging Face repository name (:func:`tokenizer`). The engine applies the chat template of
  the tokenizer it loads: a directory's template (``chat_template.jinja``,
  ``chat_template.json``, ``tokenizer_config.json``) replaces the model directory's, as a
  ``--chat-template`` does (which wins over both); a tokenizer without one, or a repository,
  makes the template unknown.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from collectors.artifacts import TOKENIZER_FILES, clock_marked, directory_chat_template
from collectors.procinfo import PROC, EngineProcess
from ledger.canonical import digest_of, sha256_digest

_MAX_FILE = 16 * 2**20  # a config or template file larger than this is not read
_JINJA_CHARS = "{}\n"  # vLLM takes a --chat-template value holding one as the template


def last_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of the last ``flag VALUE`` or ``flag=VALUE`` in ``argv`` (underscores in the
    flag's name are dashes, as vLLM's parser takes them)."""
    found = None
    args = list(argv)
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name.startswith("--"):
            name = name.replace("_", "-")
        if name != flag:
            continue
        if eq:
            found = inline
        elif i + 1 < len(args):
            found = args[i + 1]
    return found


def engine_path(process: EngineProcess, path: str, proc: Path = PROC) -> list[Path]:
    """Where ``path`` can be read, as the engine sees it first."""
    given = Path(path)
    base = proc / str(process.pid)
    if given.is_absolute():
        return [base / "root" / given.relative_to("/"), given]
    candidates = [base / "cwd" / given]
    if process.cwd is not None:
        candidates.append(Path(process.cwd) / given)
    return candidates


def _read(process: EngineProcess, path: str, proc: Path) -> tuple[bytes | None, str | None]:
    """The file's bytes, or None and why."""
    reasons = []
    for candidate in engine_path(process, path, proc):
        try:
            if candidate.stat().st_size > _MAX_FILE:
                return None, f"{path} is larger than {_MAX_FILE // 2**20} MiB"
            return candidate.read_bytes(), None
        except IsADirectoryError:
            return None, f"{path} is a directory"
        except OSError as exc:
            reasons.append(exc.strerror or type(exc).__name__)
    return None, f"{path} cannot be read ({reasons[0] if reasons else 'no candidate'})"


def config_args(process: EngineProcess, proc: Path = PROC) -> tuple[list[str], dict[str, str]]:
    """The flags the engine's ``--config`` file sets, as argv, and what could not be read."""
    path = last_value(process.argv, "--config")
    if path is None:
        return [], {}
    data, reason = _read(process, path, proc)
    if data is None:
        return [], {"config_file": f"--config {reason}: the flags it sets are unknown"}
    try:
        loaded = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        return [], {"config_file": f"--config {path} is not YAML: {exc}"}
    if loaded is None:
        return [], {}
    if not isinstance(loaded, dict):
        return [], {"config_file": f"--config {path} is not a mapping of flags"}
    args: list[str] = []
    for key, value in loaded.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + flag[2:])
        elif isinstance(value, dict | list):
            args += [flag, json.dumps(value, sort_keys=True)]
        else:
            args += [flag, str(value)]
    return args, {}


def chat_template(
    process: EngineProcess, argv: Sequence[str], proc: Path = PROC
) -> tuple[dict[str, Any] | None, dict[str, Any], str | None]:
    """The fingerprint's ``model.chat_template`` for a ``--chat-template`` override (None when
    there is none), its identity (the path as given), and why its digest is unknown."""
    value = last_value(argv, "--chat-template")
    if value is None:
        return _tokenizer_template(process, argv, proc)
    data, reason = _read(process, value, proc)
    if data is not None:
        found = {"source": "--chat-template", "digest": sha256_digest(data)}
        text = data.decode("utf-8", errors="replace")
        return clock_marked(found, text), {"chat_template_path": value}, None
    if any(c in value for c in _JINJA_CHARS):  # vLLM: then the value is the template itself
        inline = {"source": "--chat-template (inline)", "digest": sha256_digest(value.encode())}
        return clock_marked(inline, value), {}, None
    # vLLM refuses to start with a path it cannot open; this engine runs, so the collector
    # cannot read what the engine did
    return (
        {"source": "--chat-template", "digest": None},
        {"chat_template_path": value},
        f"--chat-template {reason}",
    )


def _tokenizer_dir(process: EngineProcess, value: str, proc: Path) -> Path | None:
    for directory in engine_path(process, value, proc):
        if directory.is_dir():
            return directory
    return None


def _tokenizer_template(
    process: EngineProcess, argv: Sequence[str], proc: Path
) -> tuple[dict[str, Any] | None, dict[str, Any], str | None]:
    """The chat template of the tokenizer a ``--tokenizer`` names (None: no such flag). vLLM
    takes the template of the tokenizer it loads, never the model directory's."""
    value = last_value(argv, "--tokenizer")
    if value is None:
        return None, {}, None
    directory = _tokenizer_dir(process, value, proc)
    unknown = {"source": "--tokenizer", "digest": None}
    if directory is None:
        return (
            unknown,
            {},
            "--tokenizer names no directory this collector reads: its template is unknown",
        )
    found = directory_chat_template(directory)
    if found["source"] is None:
        return (
            unknown,
            {},
            "the --tokenizer directory carries no chat template: vLLM applies its fallback "
            "for the model, or refuses chat requests",
        )
    return {**found, "source": f"--tokenizer {found['source']}"}, {}, None


def tokenizer(
    process: EngineProcess, argv: Sequence[str], proc: Path = PROC
) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """The engine's ``tokenizer`` field (``"default"``: the model's own), its identity, and
    what could not be read."""
    value = last_value(argv, "--tokenizer")
    if value is None:
        return "default", {}, {}
    directory = _tokenizer_dir(process, value, proc)
    if directory is not None:
        manifest = []
        for name in sorted(TOKENIZER_FILES):
            file = directory / name
            if file.is_file():
                digest = hashlib.sha256(file.read_bytes()).hexdigest()
                manifest.append({"path": name, "size": file.stat().st_size, "sha256": digest})
        if not manifest:
            reason = f"--tokenizer {value} holds no tokenizer files"
            return None, {"tokenizer_path": value}, {"tokenizer": reason}
        return {"digest": digest_of(manifest)}, {"tokenizer_path": value}, {}
    if value.startswith(("/", ".")):
        reason = f"--tokenizer {value} cannot be read as a directory"
        return None, {"tokenizer_path": value}, {"tokenizer": reason}
    return {"repository": value}, {}, {}  # a Hugging Face repository name
