"""The model's bytes: a per-file SHA-256 manifest and digests of its tokenizer, template and config.

Per-file digests are plain SHA-256 over each file's content, the same values as the
``model-signing`` package's file serialization and Hugging Face's ``lfs.sha256``. The manifest
lists every file (sorted by POSIX path, sizes included); names beginning with ``.git`` and the
``.cache/huggingface`` download metadata are ignored, as they say nothing about the model.

Symbolic links are followed only when they resolve inside the model directory or, for a
Hugging Face cache snapshot (``models--org--name/snapshots/<rev>``), inside that repository's
cache folder where its ``blobs/`` live. A link pointing anywhere else is refused: the snapshot
must describe what is in the directory, not whatever a link happens to reach.

Files are hashed in parallel (largest first); digests are cached (see ``digest_cache``) so an
unchanged model re-snapshots without reading its weights.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.digest_cache import DigestCache, FileStamp
from ledger.canonical import digest_of, sha256_digest
from ledger.errors import InvalidInput

Progress = Callable[[int, int], None]
"""Called with (bytes hashed so far, bytes to hash in all)."""

# Read size: a buffer that stays in the core's cache hashes faster than a large one (1.12-1.15
# against 1.05-1.10 GB/s a core for 8 MiB, EPYC host).
CHUNK = 256 << 10
TOKENIZER_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "tokenizer.model",
        "vocab.json",
        "merges.txt",
        "vocab.txt",
        "spiece.model",
        "sentencepiece.bpe.model",
        "tekken.json",
    }
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack")
TEMPLATE_FILE = "chat_template.jinja"


@dataclass(frozen=True)
class ModelFile:
    """One file of the model: its manifest path and where its bytes really are."""

    path: str
    real_path: str
    stamp: FileStamp


@dataclass(frozen=True)
class ArtifactSnapshot:
    """The ``model`` section of a fingerprint body, and what it cost to compute."""

    body: dict[str, Any]
    files: int
    total_bytes: int
    hashed_bytes: int
    cached_files: int


def _ignored(parts: tuple[str, ...]) -> bool:
    return any(p.startswith(".git") for p in parts) or parts[:2] == (".cache", "huggingface")


def _allowed_roots(root: Path) -> list[Path]:
    roots = [root]
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith(
        ("models--", "datasets--")
    ):
        roots.append(root.parent.parent)
    return roots


def check_model_dir(directory: Path) -> None:
    """The model directory exists, is a directory and can be read (before any work)."""
    if not directory.exists():
        raise InvalidInput(f"model directory {directory} does not exist", code="model_dir_missing")
    if not directory.is_dir():
        raise InvalidInput(f"{directory} is not a directory", code="model_dir_missing")
    if not os.access(directory, os.R_OK | os.X_OK):
        raise InvalidInput(f"model directory {directory} is not readable", code="model_unreadable")


def list_model_files(directory: Path) -> list[ModelFile]:
    """Every file of the model directory, sorted by manifest path."""
    check_model_dir(directory)
    root = directory.resolve()
    allowed = _allowed_roots(root)
    found: list[ModelFile] = []
    seen_dirs: set[str] = set()

    def walk(real_dir: Path, rel: tuple[str, ...]) -> None:
        if str(real_dir) in seen_dirs:
            return
        seen_dirs.add(str(real_dir))
        try:
            entries = sorted(os.scandir(real_dir), key=lambda e: e.name)
        except OSError as exc:
            raise InvalidInput(
                f"cannot list {real_dir}: {exc.strerror}", code="model_unreadable"
            ) from exc
        for entry in entries:
            parts = (*rel, entry.name)
            if _ignored(parts):
                continue
            target = Path(entry.path)
            if entry.is_symlink():
                try:
                    target = target.resolve()
                except (OSError, RuntimeError) as exc:  # a loop of links
                    raise InvalidInput(
                        f"{'/'.join(parts)} is a link that cannot be resolved ({exc})",
                        code="model_unreadable",
                    ) from exc
                if not any(target.is_relative_to(a) for a in allowed):
                    raise InvalidInput(
                        f"{'/'.join(parts)} links outside the model directory (to {target})",
                        code="model_symlink_outside",
                    )
                if not target.exists():
                    raise InvalidInput(
                        f"{'/'.join(parts)} is a dangling link (to {target})",
                        code="model_unreadable",
                    )
            if target.is_dir():
                walk(target, parts)
            elif target.is_file():
                found.append(ModelFile("/".join(parts), str(target), FileStamp.of(target.stat())))
            else:
                raise InvalidInput(
                    f"{'/'.join(parts)} is neither a regular file nor a directory",
                    code="model_unreadable",
                )

    walk(root, ())
    if not found:
        raise InvalidInput(f"model directory {directory} holds no files", code="model_dir_empty")
    return sorted(found, key=lambda f: f.path)


def sha256_file(path: str, on_bytes: Callable[[int], None] | None = None) -> str:
    """Hex SHA-256 of a file's content, read in ``CHUNK`` pieces (hashlib releases the GIL for
    each, so files hash in parallel on threads).

    Read, not memory-mapped: a mapped file truncated by another process (``rsync --inplace``,
    an editor) kills the process reading it with SIGBUS, and the collector re-snapshots
    inside the live proxy when its engine restarts, which is when files are replaced. A
    change while hashing is caught by the stat check after it (``model_changed``).
    """
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        _read_into(handle, digest, on_bytes)
    return digest.hexdigest()


def _read_into(
    handle: io.FileIO, digest: hashlib._Hash, on_bytes: Callable[[int], None] | None
) -> None:
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while n := handle.readinto(buffer):
        digest.update(view[:n])
        if on_bytes is not None:
            on_bytes(n)


def hash_files(
    files: list[ModelFile],
    cache: DigestCache,
    *,
    rehash: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
) -> tuple[dict[str, str], int, int]:
    """Hex digest per manifest path, and how many bytes and files had to be read."""
    digests: dict[str, str] = {}
    todo: list[ModelFile] = []
    for f in files:
        cached = None if rehash else cache.get(f.real_path, f.stamp)
        if cached is None:
            todo.append(f)
        else:
            digests[f.path] = cached
    total = sum(f.stamp.size for f in todo)
    done = 0
    lock = threading.Lock()

    def advance(n: int) -> None:
        nonlocal done
        with lock:
            done += n
            if progress is not None:
                progress(done, total)

    def one(f: ModelFile) -> tuple[str, str]:
        try:
            hexdigest = sha256_file(f.real_path, advance)
            after = FileStamp.of(os.stat(f.real_path))
        except OSError as exc:
            raise InvalidInput(
                f"cannot read model file {f.path}: {exc.strerror}", code="model_unreadable"
            ) from exc
        if after != f.stamp:
            raise InvalidInput(
                f"model file {f.path} changed while it was being hashed; snapshot again",
                code="model_changed",
            )
        cache.put(f.real_path, f.stamp, hexdigest)
        return f.path, hexdigest

    todo.sort(key=lambda f: f.stamp.size, reverse=True)
    if todo:
        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
            digests.update(pool.map(one, todo))
    return digests, total, len(todo)


def _subset_digest(manifest: list[dict[str, Any]], keep: Callable[[str], bool]) -> str | None:
    chosen = [entry for entry in manifest if keep(entry["path"])]
    return digest_of(chosen) if chosen else None


def _read_json(directory: Path, name: str, unknown: dict[str, str]) -> dict[str, Any] | None:
    path = directory / name
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        unknown[name] = f"{name} is not readable JSON: {exc}"
        return None
    if not isinstance(value, dict):
        unknown[name] = f"{name} is not a JSON object"
        return None
    return value


# transformers gives chat templates ``strftime_now`` (Llama 3.1 and later stamp today's date
# into the system prompt): such a template renders another prompt each day.
CLOCK_MARKER = "strftime_now"


def clock_marked(section: dict[str, Any], text: object) -> dict[str, Any]:
    """``section`` with ``reads_clock: true`` when the template ``text`` may read the date
    (left out otherwise, so other templates' fingerprints are what they were)."""
    if CLOCK_MARKER in (text if isinstance(text, str) else json.dumps(text, default=str)):
        return {**section, "reads_clock": True}
    return section


def _chat_template(
    directory: Path, digests: dict[str, str], tokenizer_config: dict[str, Any] | None
) -> dict[str, Any]:
    if TEMPLATE_FILE in digests:
        section = {"source": TEMPLATE_FILE, "digest": "sha256:" + digests[TEMPLATE_FILE]}
        try:
            text = (directory / TEMPLATE_FILE).read_text("utf-8", errors="replace")
        except OSError:
            text = ""
        return clock_marked(section, text)
    chat_json = _read_json(directory, "chat_template.json", {})
    if chat_json is not None and "chat_template" in chat_json:
        section = {
            "source": "chat_template.json",
            "digest": sha256_digest(str(chat_json["chat_template"]).encode("utf-8")),
        }
        return clock_marked(section, chat_json["chat_template"])
    if tokenizer_config is not None and "chat_template" in tokenizer_config:
        template = tokenizer_config["chat_template"]
        value = template.encode("utf-8") if isinstance(template, str) else None
        section = {
            "source": "tokenizer_config.json",
            "digest": sha256_digest(value) if value is not None else digest_of(template),
        }
        return clock_marked(section, template)
    return {"source": None, "digest": None}


def directory_chat_template(directory: Path) -> dict[str, Any]:
    """The chat template a tokenizer directory carries (``source`` None when it has none), as
    transformers finds it: ``chat_template.jinja``, ``chat_template.json``, then
    ``tokenizer_config.json``."""
    digests: dict[str, str] = {}
    template = directory / TEMPLATE_FILE
    try:
        if template.is_file():
            digests[TEMPLATE_FILE] = hashlib.sha256(template.read_bytes()).hexdigest()
    except OSError:
        pass
    return _chat_template(directory, digests, _read_json(directory, "tokenizer_config.json", {}))


def model_section(
    directory: Path, digests: dict[str, str], sizes: dict[str, int]
) -> dict[str, Any]:
    """The ``model`` body from per-file digests (pure apart from reading small JSON files)."""
    manifest = [{"path": p, "size": sizes[p], "sha256": digests[p]} for p in sorted(digests)]
    unknown: dict[str, str] = {}
    config = _read_json(directory, "config.json", unknown)
    tokenizer_config = _read_json(directory, "tokenizer_config.json", unknown)
    if config is None and "config.json" not in unknown:
        unknown["config.json"] = "the model directory has no config.json"
    top_level = {p for p in digests if "/" not in p}
    section: dict[str, Any] = {
        "digest": digest_of(manifest),
        "files": manifest,
        "weights_digest": _subset_digest(
            manifest, lambda p: p.endswith(WEIGHT_SUFFIXES) or p.endswith(".index.json")
        ),
        "config_digest": _subset_digest(manifest, lambda p: p == "config.json"),
        "tokenizer_digest": _subset_digest(
            manifest, lambda p: p in TOKENIZER_FILES and p in top_level
        ),
        "chat_template": _chat_template(directory, digests, tokenizer_config),
        "generation_config_digest": _subset_digest(
            manifest, lambda p: p == "generation_config.json"
        ),
        "architectures": (config or {}).get("architectures"),
        "model_type": (config or {}).get("model_type"),
        "config_dtype": (config or {}).get("torch_dtype", (config or {}).get("dtype")),
        "unknown": unknown,
    }
    return section


def snapshot_artifacts(
    directory: Path,
    *,
    cache: DigestCache,
    rehash: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
) -> ArtifactSnapshot:
    """Hash the model directory and build the fingerprint's ``model`` section. InvalidInput
    ``model_dir_not_a_model`` for a directory with neither a config.json nor a weight file
    (a typo'd path to some other folder would otherwise fingerprint as a model)."""
    files = list_model_files(directory)
    if not any(f.path == "config.json" or f.path.endswith(WEIGHT_SUFFIXES) for f in files):
        raise InvalidInput(
            f"model directory {directory} holds neither a config.json nor a weight file "
            f"({', '.join('*' + s for s in WEIGHT_SUFFIXES)}): not a model",
            code="model_dir_not_a_model",
        )
    digests, hashed_bytes, hashed_files = hash_files(
        files, cache, rehash=rehash, workers=workers, progress=progress
    )
    sizes = {f.path: f.stamp.size for f in files}
    return ArtifactSnapshot(
        body=model_section(directory, digests, sizes),
        files=len(files),
        total_bytes=sum(sizes.values()),
        hashed_bytes=hashed_bytes,
        cached_files=len(files) - hashed_files,
    )
