"""Progress on the terminal (stderr, so stdout stays the ids a script reads): a bar for many
starts and pool fills, a spinner for image builds. Nothing is drawn when stderr is not a
terminal."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


def stderr_console() -> Console:
    return Console(stderr=True)


class Bar:
    """One task of a live progress display."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress, self._task = progress, task

    def advance(self, steps: int = 1) -> None:
        self._progress.advance(self._task, steps)

    def update(self, completed: int, description: str | None = None) -> None:
        self._progress.update(self._task, completed=completed, description=description)


@contextlib.contextmanager
def progress_bar(description: str, total: int | None, *, keep: bool = False) -> Iterator[Bar]:
    """A bar of `total` steps (a spinner when None), removed when done unless `keep`."""
    console = stderr_console()
    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    with Progress(
        *columns,
        TimeElapsedColumn(),
        console=console,
        transient=not keep,
        disable=not console.is_terminal,
    ) as progress:
        yield Bar(progress, progress.add_task(description, total=total))
