"""The spool's group commit under SIGKILL: a record is durable before its put returns.

A child process runs many concurrent writers (threads calling ``Spool.put``, which the writer
thread commits in shared transactions, and ``put_now``, which commits on the caller's thread)
and prints each request ID the moment its put returns, as the proxy answers its client. The
parent kills it with SIGKILL mid-burst, reopens the spool, and finds every acknowledged ID in
it exactly once, each with its whole envelope; a second burst resumes on the same spool.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collectors.spool import Spool

WRITER = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    from collectors.spool import Spool

    spool = Spool(Path(sys.argv[1]))
    prefix, writers = sys.argv[2], int(sys.argv[3])
    lock = threading.Lock()

    def writer(w):
        for i in range(10_000):
            rid = f"{prefix}-{w:02d}-{i:05d}"
            envelope = (rid * 40).encode()  # ~1 KiB, its content checkable after the crash
            if w % 4 == 0:
                if not spool.put_now(rid, envelope):
                    spool.put(rid, envelope)
            else:
                spool.put(rid, envelope)
            with lock:
                sys.stdout.write(rid + "\\n")
                sys.stdout.flush()

    for w in range(writers):
        threading.Thread(target=writer, args=(w,), daemon=True).start()
    threading.Event().wait()
    """
)


def _burst(path: Path, prefix: str, until: int) -> list[str]:
    """Run the writers, SIGKILL them once ``until`` puts have returned: the acknowledged IDs."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), prefix, "16"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    acked: list[str] = []
    deadline = time.monotonic() + 120
    while len(acked) < until and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        acked.append(line.strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    acked += [line.strip() for line in proc.stdout.read().splitlines() if line.strip()]
    proc.stdout.close()
    assert len(acked) >= until, f"only {len(acked)} puts returned before the deadline"
    return acked


@pytest.mark.parametrize("rounds", [2])
def test_every_acknowledged_record_survives_sigkill_mid_burst(tmp_path: Path, rounds: int):
    path = tmp_path / "spool.sqlite"
    acked: list[str] = []
    for r in range(rounds):
        acked += _burst(path, f"r{r}", 1500)
        spool = Spool(path)
        try:
            held = spool.oldest(1_000_000)
        finally:
            spool.close()
        ids = [item.request_id for item in held]
        assert len(ids) == len(set(ids))  # none twice
        missing = set(acked) - set(ids)
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:3]}"
        for item in held:
            assert item.envelope == (item.request_id * 40).encode()  # whole, not torn
    assert len(acked) >= 3000
