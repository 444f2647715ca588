"""The model manifest: digests equal model-signing's and hashlib's; cache; links; bad input."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import model_signing.hashing
import pytest

from collectors import artifacts
from collectors.artifacts import list_model_files, snapshot_artifacts
from collectors.digest_cache import DigestCache
from ledger.errors import InvalidInput


@pytest.fixture
def model(fixture_models: dict[str, Path], tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(fixture_models["tiny"], target)
    (target / "extra").mkdir()
    (target / "extra" / "notes.txt").write_text("nested file\n")
    return target


@pytest.fixture
def cache(tmp_path: Path) -> DigestCache:
    return DigestCache(tmp_path / "cache" / "digests.sqlite")


def manifest(model: Path, cache: DigestCache | None = None, **kw: object):
    return snapshot_artifacts(model, cache=cache or DigestCache(None), **kw)  # type: ignore[arg-type]


def test_per_file_digests_equal_model_signing_and_hashlib(model: Path):
    snap = manifest(model)
    ours = {f["path"]: f["sha256"] for f in snap.body["files"]}
    theirs = {
        str(d.identifier): d.digest.digest_hex
        for d in model_signing.hashing.hash(model).resource_descriptors()
    }
    plain = {
        p.relative_to(model).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in model.rglob("*")
        if p.is_file()
    }
    assert ours == theirs == plain
    assert [f["path"] for f in snap.body["files"]] == sorted(ours)
    sizes = {f["path"]: f["size"] for f in snap.body["files"]}
    assert sizes["model.safetensors"] == (model / "model.safetensors").stat().st_size


def test_sections_name_what_they_cover(model: Path):
    body = manifest(model).body
    for field in ("digest", "weights_digest", "config_digest", "tokenizer_digest"):
        assert body[field].startswith("sha256:"), field
    assert body["generation_config_digest"].startswith("sha256:")
    template = body["chat_template"]
    assert template["source"] == "chat_template.jinja"
    expected = hashlib.sha256((model / "chat_template.jinja").read_bytes()).hexdigest()
    assert template["digest"] == f"sha256:{expected}"
    assert body["architectures"] == ["LlamaForCausalLM"]
    assert body["model_type"] == "llama" and body["config_dtype"] == "bfloat16"
    assert body["unknown"] == {}


def test_git_files_and_hub_metadata_are_ignored(model: Path):
    before = manifest(model).body["digest"]
    (model / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (model / ".git").mkdir()
    (model / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (model / ".cache" / "huggingface").mkdir(parents=True)
    (model / ".cache" / "huggingface" / "x.metadata").write_text("etag 2026-11-29\n")
    assert manifest(model).body["digest"] == before


def test_one_changed_byte_changes_the_model_and_weights_digests(model: Path, cache: DigestCache):
    first = manifest(model, cache).body
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    second = manifest(model, cache).body
    assert second["digest"] != first["digest"]
    assert second["weights_digest"] != first["weights_digest"]
    assert second["tokenizer_digest"] == first["tokenizer_digest"]
    changed = [a["path"] for a, b in zip(first["files"], second["files"], strict=True) if a != b]
    assert changed == ["model.safetensors"]


def test_the_cache_skips_unchanged_files_and_rehash_reads_all(model: Path, cache: DigestCache):
    first = manifest(model, cache)
    assert first.hashed_bytes == first.total_bytes and first.cached_files == 0
    again = manifest(model, cache)
    assert again.hashed_bytes == 0 and again.cached_files == again.files
    assert again.body == first.body
    forced = manifest(model, cache, rehash=True)
    assert forced.hashed_bytes == forced.total_bytes and forced.cached_files == 0
    assert forced.body == first.body
    # A rewrite (new mtime) is hashed again; other files still come from the cache.
    (model / "config.json").write_text((model / "config.json").read_text() + "\n")
    after = manifest(model, cache)
    assert after.hashed_bytes == (model / "config.json").stat().st_size
    assert after.cached_files == after.files - 1


def test_a_rewrite_that_puts_the_mtime_back_is_hashed_again(model: Path, cache: DigestCache):
    """cp -p, rsync -t, tar -x and touch -r rewrite a file and set its mtime back: the cache
    trusted (device, inode, size, mtime) and kept the old weights' digest."""
    weights = next(p for p in model.iterdir() if p.name.endswith(".safetensors"))
    first = manifest(model, cache)
    before = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    with open(weights, "r+b") as handle:  # same inode, same size
        handle.write(data)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert weights.stat().st_mtime_ns == before.st_mtime_ns
    after = manifest(model, cache)
    assert after.body["weights_digest"] != first.body["weights_digest"]
    assert after.body == manifest(model, cache, rehash=True).body


def test_a_cache_written_without_change_times_is_not_trusted(model: Path, tmp_path: Path):
    path = tmp_path / "c.sqlite"
    old = sqlite3.connect(path)  # the first version's table: no ctime, any digest
    old.execute(
        "CREATE TABLE file_digests (path TEXT PRIMARY KEY, device INTEGER, inode INTEGER,"
        " size INTEGER, mtime_ns INTEGER, sha256 TEXT)"
    )
    for f in list_model_files(model):
        s = f.stamp
        old.execute(
            "INSERT INTO file_digests VALUES (?, ?, ?, ?, ?, ?)",
            (f.real_path, s.device, s.inode, s.size, s.mtime_ns, "0" * 64),
        )
    old.commit()
    old.close()
    snap = manifest(model, DigestCache(path))
    assert snap.cached_files == 0 and snap.hashed_bytes == snap.total_bytes


def test_the_cache_persists_across_processes(model: Path, tmp_path: Path):
    path = tmp_path / "c.sqlite"
    manifest(model, DigestCache(path))
    reopened = DigestCache(path)
    assert manifest(model, reopened).hashed_bytes == 0


def test_an_unusable_cache_only_costs_time(model: Path, tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = DigestCache(blocker / "digests.sqlite")
    assert cache.error is not None and "unusable" in cache.error
    assert manifest(model, cache).hashed_bytes > 0
    assert manifest(model, cache).hashed_bytes > 0


def test_links_inside_the_directory_are_followed(model: Path):
    (model / "alias.json").symlink_to("config.json")
    files = {f.path: f for f in list_model_files(model)}
    assert files["alias.json"].real_path == str((model / "config.json").resolve())
    snap = manifest(model)
    by_path = {f["path"]: f["sha256"] for f in snap.body["files"]}
    assert by_path["alias.json"] == by_path["config.json"]


def test_a_loop_of_links_is_a_clear_error(model: Path):
    (model / "a").symlink_to("b")
    (model / "b").symlink_to("a")
    with pytest.raises(InvalidInput, match="cannot be resolved") as err:
        list_model_files(model)
    assert err.value.code == "model_unreadable"


def test_links_outside_the_directory_are_refused(model: Path, tmp_path: Path):
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"weights from somewhere else")
    (model / "extra.bin").symlink_to(outside)
    with pytest.raises(InvalidInput) as err:
        manifest(model)
    assert err.value.code == "model_symlink_outside" and "extra.bin" in err.value.message


def test_a_hugging_face_cache_snapshot_is_read_through_its_blobs(model: Path, tmp_path: Path):
    repo = tmp_path / "hub" / "models--org--fixture"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in model.iterdir():
        if path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            shutil.copy(path, repo / "blobs" / digest)
            (snapshot / path.name).symlink_to(Path("../../blobs") / digest)
    hub = {f["path"]: f["sha256"] for f in manifest(snapshot).body["files"]}
    # The blob's name is its lfs.sha256: the manifest's digest equals it.
    for name, digest in hub.items():
        assert (repo / "blobs" / digest).exists(), name
    local = {f["path"]: f["sha256"] for f in manifest(model).body["files"] if "/" not in f["path"]}
    assert hub == local


def test_a_dangling_link_is_an_error(model: Path):
    (model / "gone.bin").symlink_to(model / "missing.bin")
    with pytest.raises(InvalidInput) as err:
        manifest(model)
    assert err.value.code == "model_unreadable"


@pytest.mark.parametrize("case", ["missing", "file", "empty"])
def test_a_bad_model_directory_is_a_clear_error(tmp_path: Path, case: str):
    target = tmp_path / "m"
    if case == "file":
        target.write_text("x")
    elif case == "empty":
        target.mkdir()
    with pytest.raises(InvalidInput) as err:
        manifest(target)
    assert err.value.code in {"model_dir_missing", "model_dir_empty"}
    assert str(target) in err.value.message


def test_an_unreadable_file_is_named(model: Path, monkeypatch: pytest.MonkeyPatch):
    # Tests run as root, which reads any mode; so refuse the open as the kernel would (EACCES).
    real_open = open

    def guarded(path: str, *args: object, **kw: object):
        if str(path).endswith("config.json"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(artifacts, "open", guarded, raising=False)
    with pytest.raises(InvalidInput) as err:
        manifest(model)
    assert err.value.code == "model_unreadable"
    assert "config.json" in err.value.message and "Permission denied" in err.value.message


def test_a_special_file_is_refused(model: Path):
    os.mkfifo(model / "pipe")
    with pytest.raises(InvalidInput) as err:
        manifest(model)
    assert "pipe" in err.value.message and err.value.code == "model_unreadable"


def test_malformed_configs_are_reported_not_fatal(model: Path):
    (model / "config.json").write_text("{not json")
    (model / "tokenizer_config.json").write_text("[1, 2]")
    body = manifest(model).body
    assert "not readable JSON" in body["unknown"]["config.json"]
    assert "not a JSON object" in body["unknown"]["tokenizer_config.json"]
    assert body["architectures"] is None and body["config_digest"].startswith("sha256:")


def test_chat_template_from_tokenizer_config(model: Path):
    (model / "chat_template.jinja").unlink()
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages[0]['content'] }}"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    template = manifest(model).body["chat_template"]
    assert template["source"] == "tokenizer_config.json"
    expected = hashlib.sha256(b"{{ messages[0]['content'] }}").hexdigest()
    assert template["digest"] == f"sha256:{expected}"
    del config["chat_template"]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    assert manifest(model).body["chat_template"] == {"source": None, "digest": None}


def test_a_template_that_reads_the_date_is_marked(model: Path):
    """transformers gives templates strftime_now (Llama 3.1 and later stamp today's date): the
    fingerprint says so, and the cache serves no chat answer of such an environment. Other
    templates' sections are as they were."""
    assert "reads_clock" not in manifest(model).body["chat_template"]
    dated = "{{ strftime_now('%d %b %Y') }}{{ messages[0]['content'] }}"
    (model / "chat_template.jinja").write_text(dated)
    template = manifest(model).body["chat_template"]
    assert template["source"] == "chat_template.jinja" and template["reads_clock"] is True
    (model / "chat_template.jinja").unlink()
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": dated}]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    assert manifest(model).body["chat_template"]["reads_clock"] is True


def test_an_empty_file_has_the_empty_digest(model: Path):
    (model / "empty.txt").write_bytes(b"")
    files = {f["path"]: f for f in manifest(model).body["files"]}
    assert files["empty.txt"] == {
        "path": "empty.txt",
        "size": 0,
        "sha256": hashlib.sha256(b"").hexdigest(),
    }


@pytest.mark.parametrize(
    ("files", "refused"),
    [
        ({"readme.txt": b"notes"}, True),
        ({"docs/config.json": b"{}", "a.txt": b"x"}, True),  # config.json only counts at the top
        ({"config.json": b"{}"}, False),
        ({"model.gguf": b"GGUF"}, False),
        ({"shards/model-00001.safetensors": b"w"}, False),
    ],
)
def test_a_directory_without_config_or_weights_is_not_a_model(
    tmp_path: Path, files: dict[str, bytes], refused: bool
):
    model = tmp_path / "m"
    for name, data in files.items():
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).write_bytes(data)
    if refused:
        with pytest.raises(InvalidInput) as err:
            snapshot_artifacts(model, cache=DigestCache(None))
        assert err.value.code == "model_dir_not_a_model" and str(model) in err.value.message
    else:
        assert snapshot_artifacts(model, cache=DigestCache(None)).files == len(files)


def test_a_file_truncated_while_it_is_hashed_is_model_changed_not_a_crash(tmp_path: Path):
    """A memory-mapped file truncated by another process killed the reader with SIGBUS (the
    live collector re-snapshots when its engine restarts, when files are replaced). Run in a
    child process, so that a signal would show as its exit status."""
    child = (
        "import os, sys\n"
        "from collectors.artifacts import CHUNK, hash_files, list_model_files\n"
        "from collectors.digest_cache import DigestCache\n"
        "from ledger.errors import InvalidInput\n"
        "d = sys.argv[1]\n"
        "with open(os.path.join(d, 'model.safetensors'), 'wb') as f:\n"
        "    f.truncate(3 * CHUNK)\n"
        "files = list_model_files(__import__('pathlib').Path(d))\n"
        "def cut(done, total):\n"
        "    os.truncate(os.path.join(d, 'model.safetensors'), 0)\n"
        "try:\n"
        "    hash_files(files, DigestCache(None), progress=cut)\n"
        "except InvalidInput as exc:\n"
        "    print(exc.code)\n"
    )
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    done = subprocess.run(
        [sys.executable, "-c", child, str(model)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])
    assert done.stdout.strip() == "model_changed"


def test_a_name_that_is_not_utf8_is_the_same_clear_answer_with_the_cache(
    model: Path, cache: DigestCache
):
    """The cache keys files by their path as text: a name that is not UTF-8 raised
    UnicodeEncodeError out of the cache (a traceback from `ledger fingerprint`, and a dead
    engine watcher in the collector). With or without the cache, the answer is the same."""
    os.close(os.open(os.fsencode(model) + b"/odd-\xff.txt", os.O_CREAT | os.O_WRONLY, 0o644))

    def outcome(with_cache: DigestCache | None) -> object:
        try:
            return manifest(model, with_cache).body
        except InvalidInput as exc:
            return exc.code

    assert outcome(cache) == outcome(None)


def test_a_cache_others_could_write_is_not_read(model: Path, tmp_path: Path):
    """An entry written by another user would make the fingerprint claim a digest of content
    that is not on disk: a cache file others could write is not read (every file hashed)."""
    path = tmp_path / "shared" / "digests.sqlite"
    first = manifest(model, DigestCache(path))
    weights = next(f for f in first.body["files"] if f["path"].endswith(".safetensors"))
    with sqlite3.connect(path) as conn:  # as any writer could
        conn.execute("UPDATE file_stamps SET sha256 = ?", ("ab" * 32,))
    os.chmod(path, 0o666)
    opened = DigestCache(path)
    assert opened.error is not None and "not trusted" in opened.error and "0666" in opened.error
    again = manifest(model, opened)
    assert again.cached_files == 0 and again.body == first.body
    by_path = {f["path"]: f["sha256"] for f in again.body["files"]}
    assert by_path[weights["path"]] == weights["sha256"]
    os.chmod(path, 0o600)
    os.chmod(path.parent, 0o777)  # a directory others may write to: the file could be replaced
    assert "could be replaced" in str(DigestCache(path).error)
    os.chmod(path.parent, 0o700)
    assert DigestCache(path).error is None


def test_a_new_cache_is_private_whatever_the_umask(model: Path, tmp_path: Path):
    path = tmp_path / "fresh" / "digests.sqlite"
    old = os.umask(0o002)
    try:
        cache = DigestCache(path)
    finally:
        os.umask(old)
    assert cache.error is None
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert oct(path.parent.stat().st_mode & 0o777) == oct(0o700)
    manifest(model, cache)
    assert manifest(model, cache).cached_files > 0
