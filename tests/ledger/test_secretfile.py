"""ledger.secretfile: secret files are 0600 whatever the umask, never written through a
symlink, never over an existing file unless asked, and never half-written."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.errors import InvalidInput
from ledger.secretfile import (
    PUBLIC_MODE,
    SecretFileExists,
    check_private_file,
    check_private_location,
    stage_secret_file,
    write_secret_file,
)
from ledger.signing import SigningKey


@pytest.fixture
def umask0() -> Iterator[None]:
    old = os.umask(0)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def only(directory: Path) -> set[str]:
    """The names in ``directory`` (no temporary file may be left behind)."""
    return {p.name for p in directory.iterdir()}


@pytest.mark.parametrize("umask", [0, 0o022, 0o077])
def test_a_new_secret_is_0600_whatever_the_umask(tmp_path: Path, umask: int):
    old = os.umask(umask)
    try:
        write_secret_file(tmp_path / "s", "secret\n")
        write_secret_file(tmp_path / "p.pub", "public\n", mode=PUBLIC_MODE)
    finally:
        os.umask(old)
    assert mode(tmp_path / "s") == 0o600 and (tmp_path / "s").read_text() == "secret\n"
    assert mode(tmp_path / "p.pub") == 0o644
    assert only(tmp_path) == {"s", "p.pub"}


def test_a_new_directory_is_private(tmp_path: Path, umask0: None):
    write_secret_file(tmp_path / "new" / "deeper" / "s", b"x")
    assert mode(tmp_path / "new" / "deeper") == 0o700 and mode(tmp_path / "new") == 0o700


def test_an_existing_world_readable_file_is_refused_then_forced_to_0600(
    tmp_path: Path, umask0: None
):
    target = tmp_path / "token"
    target.write_text("old\n")
    target.chmod(0o644)
    with pytest.raises(SecretFileExists) as err:
        write_secret_file(target, "new\n")
    assert err.value.code == "file_exists" and "already exists" in err.value.message
    assert target.read_text() == "old\n" and mode(target) == 0o644
    inode = target.stat().st_ino
    write_secret_file(target, "new\n", overwrite=True)
    assert target.read_text() == "new\n" and mode(target) == 0o600
    assert target.stat().st_ino != inode  # a new file: the old one's mode and links are gone
    assert only(tmp_path) == {"token"}


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlink_is_refused_and_never_followed(tmp_path: Path, umask0: None, dangling: bool):
    target = tmp_path / "elsewhere"
    if not dangling:
        target.write_text("victim\n")
        target.chmod(0o644)
    link = tmp_path / "token"
    link.symlink_to(target)
    with pytest.raises(SecretFileExists) as err:
        write_secret_file(link, "secret\n")
    assert "symbolic link" in err.value.message
    assert link.is_symlink()
    # overwrite replaces the link itself: the target keeps its content, mode, or absence
    write_secret_file(link, "secret\n", overwrite=True)
    assert not link.is_symlink() and link.read_text() == "secret\n" and mode(link) == 0o600
    if dangling:
        assert not target.exists()
    else:
        assert target.read_text() == "victim\n" and mode(target) == 0o644
    assert only(tmp_path) == ({"token"} if dangling else {"token", "elsewhere"})


def test_a_directory_or_fifo_is_refused_even_with_overwrite(tmp_path: Path):
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "f")
    for name in ("d", "f"):
        with pytest.raises(InvalidInput) as err:
            write_secret_file(tmp_path / name, "x", overwrite=True)
        assert err.value.code == "not_a_regular_file"
    assert only(tmp_path) == {"d", "f"}


def test_staged_secret_is_invisible_until_published_and_exclusive_at_publish(tmp_path: Path):
    path = tmp_path / "token"
    staged = stage_secret_file(path, "secret\n")
    assert not path.exists() and len(only(tmp_path)) == 1  # one hidden temporary file
    staged.discard()
    assert only(tmp_path) == set()
    # a file that appears between staging and publishing is not overwritten
    staged = stage_secret_file(path, "secret\n")
    path.write_text("theirs\n")
    with pytest.raises(SecretFileExists):
        staged.publish()
    assert path.read_text() == "theirs\n" and only(tmp_path) == {"token"}
    # a symlink that appears then is not followed either
    path.unlink()
    staged = stage_secret_file(path, "secret\n")
    path.symlink_to(tmp_path / "victim")
    with pytest.raises(SecretFileExists):
        staged.publish()
    assert not (tmp_path / "victim").exists() and only(tmp_path) == {"token"}


def test_a_published_secret_can_be_undone(tmp_path: Path):
    staged = stage_secret_file(tmp_path / "token", "secret\n")
    staged.publish()
    assert (tmp_path / "token").read_text() == "secret\n"
    staged.discard()
    assert only(tmp_path) == set()


def test_key_pair_is_checked_before_either_file_is_written(tmp_path: Path, umask0: None):
    key = SigningKey.generate()
    (tmp_path / "k.pub.pem").write_text("stale\n")
    with pytest.raises(SecretFileExists):
        key.write(tmp_path / "k.pem", tmp_path / "k.pub.pem")
    assert only(tmp_path) == {"k.pub.pem"}  # no private key left behind
    key.write(tmp_path / "k.pem", tmp_path / "k.pub.pem", overwrite=True)
    assert mode(tmp_path / "k.pem") == 0o600 and mode(tmp_path / "k.pub.pem") == 0o644
    assert SigningKey.load(tmp_path / "k.pem").key_id == key.key_id


def private(path: Path, file_mode: int = 0o600) -> Path:
    path.write_text("key\n")
    path.chmod(file_mode)
    return path


@pytest.mark.parametrize("file_mode", [0o644, 0o640, 0o604, 0o660, 0o602, 0o620, 0o610])
def test_check_private_file_refuses_what_others_can_reach(tmp_path: Path, file_mode: int):
    for fine in (0o600, 0o400, 0o700):
        check_private_file(private(tmp_path / f"ok-{fine:o}.pem", fine), setting="S")
    key = private(tmp_path / "k.pem", file_mode)
    with pytest.raises(InvalidInput) as err:
        check_private_file(key, setting="LEDGER_LOG_KEY_FILE")
    assert err.value.code == "insecure_private_file"
    assert "LEDGER_LOG_KEY_FILE=" in err.value.message and f"{file_mode:04o}" in err.value.message


def test_check_private_file_follows_a_symlink_to_the_file_that_would_be_read(tmp_path: Path):
    link = tmp_path / "k.pem"
    link.symlink_to(private(tmp_path / "real.pem", 0o644))
    with pytest.raises(InvalidInput) as err:
        check_private_file(link, setting="LEDGER_LOG_KEY_FILE")
    assert "symbolic link" in err.value.message
    (tmp_path / "real.pem").chmod(0o600)
    check_private_file(link, setting="LEDGER_LOG_KEY_FILE")
    (tmp_path / "real.pem").unlink()
    with pytest.raises(InvalidInput):  # dangling
        check_private_file(link, setting="LEDGER_LOG_KEY_FILE")


def test_check_private_file_refuses_an_open_directory_but_not_a_sticky_one(tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    key = private(shared / "k.pem")
    check_private_file(key, setting="S")
    shared.chmod(0o777)
    with pytest.raises(InvalidInput) as err:
        check_private_file(key, setting="S")
    assert "writable by group or others" in err.value.message
    with pytest.raises(InvalidInput):
        check_private_location(shared / "new.pem", setting="S")
    shared.chmod(0o1777)  # like /tmp: others cannot replace this user's file
    check_private_file(key, setting="S")
    check_private_location(shared / "new.pem", setting="S")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_check_private_file_refuses_another_users_file(tmp_path: Path):
    key = private(tmp_path / "k.pem")
    os.chown(key, 65534, 65534)
    with pytest.raises(InvalidInput) as err:
        check_private_file(key, setting="S")
    assert "owned by uid 65534" in err.value.message


def test_an_atomic_write_follows_no_symlink_planted_beside_its_target(tmp_path: Path) -> None:
    """``write_atomically`` (bundles, reports) once staged its data at a predictable name
    beside the target: a symlink planted there sent the data elsewhere. Its temporary file is
    now created exclusively under a random name, owner-only, so nothing planted is followed."""
    import os

    from ledger.atomic_file import write_atomically

    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "bundle.json"
    for planted in (f".bundle.json.{os.getpid()}.tmp", ".bundle.json.tmp"):
        (tmp_path / planted).symlink_to(victim)
    write_atomically(target, b"{}")
    assert victim.read_text() == "keep"
    assert target.read_bytes() == b"{}" and not target.is_symlink()
    assert mode(target) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == sorted(
        [f".bundle.json.{os.getpid()}.tmp", ".bundle.json.tmp"]
    )
