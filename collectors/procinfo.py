"""The engine's process, read from /proc: found by its listening port, then argv, env and exe.

Only what this user may read is read. A process of another user hides its environment and file
descriptors; the caller gets :class:`ProcessUnreadable` with the reason, never a guess.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_LISTEN = "0A"


class ProcessUnreadable(Exception):
    """A /proc entry exists but cannot be read (another user's process, or it exited).

    ``str(exc)`` names the process, port or count; ``reason`` says the same without any value
    that changes from one run or host to the next, for the fingerprint body (whose ID must not
    change with the engine's PID).
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class EngineProcess:
    pid: int
    argv: tuple[str, ...]
    env: dict[str, str]
    exe: str | None
    cwd: str | None

    def interpreter(self) -> str | None:
        """The Python that runs the engine, as invoked (a venv's python, not its base).

        ``/proc/PID/exe`` resolves a virtual environment's symlink to the base interpreter,
        which would see none of the engine's packages; so prefer argv[0] when it is a Python,
        or the shebang of the console script argv[0] names, and fall back to ``exe``.
        """
        first = Path(self.argv[0])
        if not first.is_absolute() and self.cwd is not None:
            first = Path(self.cwd) / first
        if first.name.startswith("python") and first.exists():
            return str(first)
        try:
            with first.open("rb") as handle:
                head = handle.readline(512)
        except OSError:
            return self.exe
        if head.startswith(b"#!"):
            interpreter = head[2:].split()[0].decode("utf-8", "replace")
            if Path(interpreter).name.startswith("python"):
                return interpreter
        return self.exe


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes: set[str] = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN:
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port:
                    inodes.add(fields[9])
    return inodes


def find_pid_by_port(port: int, proc: Path = PROC) -> int:
    """The lowest PID (the parent, for forked servers) holding a socket listening on ``port``."""
    inodes = _listening_inodes(port, proc)
    if not inodes:
        raise ProcessUnreadable(
            f"no socket is listening on port {port} on this host",
            "no socket is listening on the engine's port on this host",
        )
    wanted = {f"socket:[{inode}]" for inode in inodes}
    hidden = 0
    holders: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    holders.append(int(entry.name))
                    break
        except PermissionError:
            hidden += 1
        except OSError:
            continue
    if holders:
        return min(holders)
    reason = "the engine's port is listening but no process of this user holds it"
    message = f"port {port} is listening but no process of this user holds it"
    if hidden:
        reason += " (processes of other users cannot be inspected; pass --engine-pid)"
        message += f" ({hidden} processes of other users cannot be inspected; pass --engine-pid)"
    raise ProcessUnreadable(message, reason)


def parse_environ(raw: bytes) -> dict[str, str]:
    """A process's ``environ`` (``NAME=value`` entries, NUL-separated) as it and the container
    runtime read it. A name given twice: the process's ``getenv`` (and ``os.environ``) takes
    its first value, but the NVIDIA container runtime, which reads its variables
    (:data:`RUNTIME_READ`) before the process starts, takes the last: Docker appends
    ``NVIDIA_VISIBLE_DEVICES=<device_ids>`` after the CUDA image's
    ``NVIDIA_VISIBLE_DEVICES=all``, and that last value chose the devices."""
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        raw_name, sep, value = item.partition(b"=")
        if not sep:
            continue
        name = raw_name.decode("utf-8", "replace")
        if name not in env or name.startswith(RUNTIME_READ):
            env[name] = value.decode("utf-8", "replace")
    return env


# The variables the NVIDIA container runtime reads, where the last value wins (names and
# prefixes); NVIDIA_TF32_OVERRIDE and the like are read in the process by getenv: the first.
RUNTIME_READ = (
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_REQUIRE_",
    "NVIDIA_DISABLE_REQUIRE",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
)


def own_environ(proc: Path = PROC) -> Mapping[str, str]:
    """This process's environment as it was started, read as :func:`parse_environ` reads
    another's (``os.environ`` keeps a name's first value); ``os.environ`` where ``/proc`` is
    not readable."""
    try:
        return parse_environ((proc / "self" / "environ").read_bytes())
    except OSError:
        return os.environ


def read_process(pid: int, proc: Path = PROC) -> EngineProcess:
    """argv, environment and executable of ``pid``."""
    base = proc / str(pid)
    try:
        raw_argv = (base / "cmdline").read_bytes()
    except FileNotFoundError as exc:
        raise ProcessUnreadable(
            f"process {pid} does not exist", "the engine process does not exist"
        ) from exc
    except PermissionError as exc:
        raise ProcessUnreadable(
            f"cannot read the command line of process {pid}",
            "cannot read the engine process's command line",
        ) from exc
    argv = tuple(a.decode("utf-8", "replace") for a in raw_argv.split(b"\0") if a)
    try:
        raw_env = (base / "environ").read_bytes()
    except PermissionError as exc:
        raise ProcessUnreadable(
            f"cannot read the environment of process {pid}: it belongs to another user",
            "cannot read the engine process's environment: it belongs to another user",
        ) from exc
    except FileNotFoundError as exc:
        raise ProcessUnreadable(f"process {pid} exited", "the engine process exited") from exc
    env = parse_environ(raw_env)
    links: dict[str, str | None] = {}
    for link in ("exe", "cwd"):
        try:
            links[link] = os.readlink(base / link)
        except OSError:
            links[link] = None
    if not argv:
        raise ProcessUnreadable(
            f"process {pid} has no command line (a zombie or kernel thread)",
            "the engine process has no command line (a zombie or kernel thread)",
        )
    return EngineProcess(pid, argv, env, links["exe"], links["cwd"])
