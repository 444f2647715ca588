"""Progress displays: on stderr, and only where stderr is a terminal.

Piped, redirected or in a CI log, a command writes nothing on stderr but what it means to say
(its error line, its log lines): no bar, no blank line, no control sequence.
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from cli.common import err_console


def progress(*columns: str | ProgressColumn, show: bool = True) -> Progress:
    """A transient progress display on stderr, drawn when ``show`` and stderr is a terminal."""
    return Progress(
        *columns,
        console=err_console,
        transient=True,
        disable=not (show and err_console.is_terminal),
    )


class DelayedByteProgress:
    """Callable as ``progress(done, total)``: a byte progress bar that appears once an
    operation has run for ``delay`` seconds."""

    def __init__(self, label: str, delay: float = 1.0) -> None:
        self.label = label
        self.delay = delay
        self.started = time.monotonic()
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __call__(self, done: int, total: int) -> None:
        if self._progress is None:
            if time.monotonic() - self.started < self.delay:
                return
            self._progress = progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=total)
        assert self._task is not None
        self._progress.update(self._task, completed=done, total=total)

    def __enter__(self) -> DelayedByteProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
