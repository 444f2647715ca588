"""Finding and reading the engine's process through /proc."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from collectors import procinfo
from collectors.procinfo import ProcessUnreadable, find_pid_by_port, read_process


def test_the_listening_process_is_found_by_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert find_pid_by_port(port) == os.getpid()


def test_a_port_nobody_listens_on():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening
        with pytest.raises(ProcessUnreadable, match=f"no socket is listening on port {port}"):
            find_pid_by_port(port)


def test_own_process_is_read_with_its_interpreter():
    proc = read_process(os.getpid())
    assert proc.argv == tuple(sys.orig_argv)
    assert proc.env.get("PATH") == os.environ.get("PATH")
    assert proc.cwd == os.getcwd()
    assert proc.interpreter() is not None


def test_a_missing_process():
    with pytest.raises(ProcessUnreadable, match="does not exist"):
        read_process(2**22 + 12345)


def test_another_users_environment_is_unreadable_not_guessed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    entry = tmp_path / "777"
    entry.mkdir()
    (entry / "cmdline").write_bytes(b"python\0-m\0vllm.entrypoints.openai.api_server\0")
    (entry / "environ").write_bytes(b"")
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == "environ":  # what the kernel answers for another user's process
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(procinfo.Path, "read_bytes", read_bytes)
    with pytest.raises(ProcessUnreadable, match="belongs to another user"):
        read_process(777, proc=tmp_path)


def test_venv_interpreter_is_preferred_to_the_resolved_exe(tmp_path: Path):
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)
    script = tmp_path / "venv" / "bin" / "vllm"
    script.write_text(f"#!{venv_python}\nimport sys\n")
    base = procinfo.EngineProcess(1, (str(venv_python), "-m", "vllm"), {}, sys.executable, None)
    assert base.interpreter() == str(venv_python)
    relative = procinfo.EngineProcess(1, ("venv/bin/python",), {}, "/x", str(tmp_path))
    assert relative.interpreter() == str(tmp_path / "venv/bin/python")
    console = procinfo.EngineProcess(1, (str(script), "serve", "m"), {}, sys.executable, None)
    assert console.interpreter() == str(venv_python)
    unknown = procinfo.EngineProcess(1, ("/nonexistent/engine",), {}, "/usr/bin/python3", None)
    assert unknown.interpreter() == "/usr/bin/python3"
