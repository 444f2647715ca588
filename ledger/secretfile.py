"""Secret files (private keys, bearer tokens): mode 0600, never through a symlink, never
half-written, never over an existing file unless the caller says so.

Every file that holds a secret is written by :func:`write_secret_file` (or staged with
:func:`stage_secret_file` and published once the rest of the operation has succeeded):

1. The final name is looked at without following links (``lstat``). A file or symbolic link
   already there is refused (:class:`SecretFileExists`, ``file_exists``) unless ``overwrite``;
   a directory or any other non-regular file is always refused (``not_a_regular_file``).
2. The content goes to a new temporary file in the same directory, opened with
   ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600, then ``fchmod``-ed to the requested mode
   (``fchmod`` ignores the umask), checked with ``fstat``, written and ``fsync``-ed.
3. Publishing gives it its final name: without ``overwrite`` by ``link(2)``, which fails if the
   name exists at that instant (a dangling symlink included), so creation is exclusive; with
   ``overwrite`` by ``rename(2)``, which replaces a file or a symbolic link *itself*, never the
   link's target. Either way the name appears at once with the whole content, or not at all.
4. The published name is checked again (``lstat``: the same inode, a regular file, the mode)
   and the directory is ``fsync``-ed.

:func:`check_private_file` is the reading side: it refuses a private file that anyone but its
owner could read or replace (production mode runs it on the ledger's log key).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import Conflict, InvalidInput

SECRET_MODE = 0o600
PUBLIC_MODE = 0o644
# link(2) is not supported everywhere (some network and FUSE file systems): then the name is
# checked once more and rename(2) publishes (which still never follows a symlink).
_NO_LINK = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}


class SecretFileExists(Conflict):
    """The name is taken (a file or a symbolic link) and the caller did not ask to overwrite."""

    code = "file_exists"


def _unwritable(path: Path, exc: OSError) -> InvalidInput:
    return InvalidInput(
        f"cannot write {path}: {exc.strerror or exc}",
        code="file_not_writable",
        details={"path": str(path)},
    )


def _check_target(path: Path, overwrite: bool) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    if stat.S_ISLNK(st.st_mode):
        if not overwrite:
            raise SecretFileExists(
                f"{path} is a symbolic link; refusing to write a secret through it",
                details={"path": str(path)},
            )
        return
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(
            f"{path} exists and is not a regular file; refusing to write a secret there",
            code="not_a_regular_file",
            details={"path": str(path)},
        )
    if not overwrite:
        raise SecretFileExists(
            f"{path} already exists; refusing to overwrite it", details={"path": str(path)}
        )


@dataclass
class StagedSecret:
    """A secret written in full to a temporary file beside its final name, not yet visible
    there. :meth:`publish` gives it the name; :meth:`discard` removes it."""

    path: Path
    temp: Path
    mode: int
    overwrite: bool
    _dev_ino: tuple[int, int]
    published: bool = False

    def publish(self) -> None:
        try:
            _check_target(self.path, self.overwrite)
            if self.overwrite:
                os.replace(self.temp, self.path)
            else:
                try:
                    os.link(self.temp, self.path, follow_symlinks=False)
                except FileExistsError:
                    _check_target(self.path, False)  # raises with the reason
                    raise
                except OSError as exc:
                    if exc.errno not in _NO_LINK:
                        raise
                    _check_target(self.path, False)
                    os.rename(self.temp, self.path)
                else:
                    os.unlink(self.temp)
        except OSError as exc:
            self.discard()
            raise _unwritable(self.path, exc) from exc
        except BaseException:
            self.discard()
            raise
        self.published = True
        self._verify()
        _fsync_dir(self.path.parent)

    def _verify(self) -> None:
        st = os.lstat(self.path)
        if (
            (st.st_dev, st.st_ino) != self._dev_ino
            or not stat.S_ISREG(st.st_mode)
            or stat.S_IMODE(st.st_mode) != self.mode
        ):
            raise InvalidInput(
                f"{self.path} changed while it was written (now mode "
                f"{stat.S_IMODE(st.st_mode):04o}); not trusting it",
                code="file_not_writable",
                details={"path": str(self.path)},
            )

    def discard(self) -> None:
        """Remove the temporary file (before publishing) or the published one (undo)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.temp)
        if self.published:
            with contextlib.suppress(OSError):
                st = os.lstat(self.path)
                if (st.st_dev, st.st_ino) == self._dev_ino:
                    os.unlink(self.path)
            self.published = False


def stage_secret_file(
    path: Path, data: bytes | str, *, overwrite: bool = False, mode: int = SECRET_MODE
) -> StagedSecret:
    """Write ``data`` to a temporary file beside ``path`` (see the module docstring); refuse
    now what publishing would refuse, so a caller can stage before committing elsewhere."""
    content = data.encode("utf-8") if isinstance(data, str) else data
    _check_target(path, overwrite)
    directory = path.parent
    try:
        make_private_dirs(directory)
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    temp = directory / f".{path.name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(temp, flags, SECRET_MODE)
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    try:
        os.fchmod(fd, mode)  # the umask narrowed the open's mode; fchmod sets it exactly
        st = os.fstat(fd)
        if stat.S_IMODE(st.st_mode) != mode:
            raise InvalidInput(
                f"cannot set mode {mode:04o} on files in {directory} (the file system keeps "
                f"{stat.S_IMODE(st.st_mode):04o}); put secrets on one that honours modes",
                code="file_not_writable",
                details={"path": str(path)},
            )
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        os.unlink(temp)
        raise _unwritable(path, exc) from exc
    except BaseException:
        os.close(fd)
        os.unlink(temp)
        raise
    os.close(fd)
    return StagedSecret(path, temp, mode, overwrite, (st.st_dev, st.st_ino))


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each mode 0700 (at most)."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        if directory.parent == directory:
            break
        directory = directory.parent
    for item in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(item, 0o700)


def write_secret_file(
    path: Path, data: bytes | str, *, overwrite: bool = False, mode: int = SECRET_MODE
) -> None:
    """Create ``path`` holding ``data``, mode ``mode`` exactly, atomically, never following a
    symlink; an existing name is refused unless ``overwrite`` (then replaced, link and all)."""
    stage_secret_file(path, data, overwrite=overwrite, mode=mode).publish()


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _refusal(path: Path, setting: str, reason: str) -> InvalidInput:
    return InvalidInput(
        f"{setting}={path}: {reason}",
        code="insecure_private_file",
        details={"path": str(path), "setting": setting},
    )


def _open_directory(directory: Path) -> str | None:
    """Why others could replace a file in ``directory`` (None: they cannot)."""
    mode = os.stat(directory).st_mode
    if stat.S_IMODE(mode) & 0o022 and not mode & stat.S_ISVTX:
        return (
            f"its directory {directory} is writable by group or others "
            f"(mode {stat.S_IMODE(mode):04o}), so the file could be replaced"
        )
    return None


def _others_could(path: Path, mask: int, what: str) -> str | None:
    """Why someone but this process's user could read or replace the file at ``path`` (None:
    nobody could): its mode has a bit of ``mask`` (``what`` says what that lets others do),
    it is owned by another user or is no regular file, or its directory others may write to
    without the sticky bit. Through a symbolic link, the file that would be read is judged."""
    try:
        st = os.stat(path)
        real = Path(os.path.realpath(path))
        problem = _open_directory(real.parent)
    except OSError as exc:
        return f"cannot check it: {exc.strerror or exc}"
    via = f" (a symbolic link to {real})" if os.path.islink(path) else ""
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file{via}"
    mode = stat.S_IMODE(st.st_mode)
    if mode & mask:
        return f"{what} (mode {mode:04o}){via}; run `chmod 600 {real}`"
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not this process's {uid}{via}"
    return problem + via if problem else None


def check_private_file(path: Path, *, setting: str) -> None:
    """Refuse (``insecure_private_file``) a private file that anyone but this process's user
    could read or replace: accessible to group or others (through a symbolic link too: the
    file that would be read is checked), owned by another user, not a regular file, or in a
    directory others may write to without the sticky bit. ``setting`` names the variable the
    path came from, for the message."""
    problem = _others_could(path, 0o077, "the private key is accessible to group or others")
    if problem:
        raise _refusal(path, setting, problem)


def writable_by_others(path: Path) -> str | None:
    """Why a user other than this process's could write or replace the file at ``path``
    (None: none could), judged as :func:`check_private_file` judges, reading allowed."""
    return _others_could(path, 0o022, "it is writable by group or others")


def check_private_location(path: Path, *, setting: str) -> None:
    """Before creating a private file at ``path``: refuse a directory others may write to."""
    directory = Path(os.path.realpath(path.parent))
    try:
        problem = _open_directory(directory)
    except FileNotFoundError:
        return  # stage_secret_file creates it, mode 0700
    except OSError as exc:
        raise _refusal(path, setting, f"cannot check its directory: {exc.strerror}") from exc
    if problem:
        raise _refusal(path, setting, problem)
