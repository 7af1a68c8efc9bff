"""Progress on stderr (stdout stays the ids a script reads): a bar for many starts and pool
fills, a spinner with the builder's last lines under it for image builds.

On a terminal each is one Rich live display, redrawn in place and removed when done; log
records (warnings) printed meanwhile go above it, never through it. When stderr is not a
terminal nothing is drawn and no control code is written: the builder's lines are copied to
stderr as plain lines."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, TypeAlias

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.spinner import Spinner
from rich.text import Text

BUILD_LOG = "orchestrator.build"
"""The library's logger of builder output (one INFO record a line, control codes removed)."""
TAIL_LINES = 6
"""Builder lines shown under the spinner."""


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

    def describe(self, description: str) -> None:
        self._progress.update(self._task, description=description)


Moved: TypeAlias = "list[tuple[logging.StreamHandler[Any], Any]]"
"""Log handlers moved to write through a live display, each with the stream it had."""


def _logs_above() -> Moved:
    """Once a live display runs (it has put a proxy of stderr in sys.stderr), make the log
    handlers that write to stderr write through that proxy: their lines go above the
    display. Returns what `_logs_back` needs to undo it."""
    proxy = sys.stderr
    stream = getattr(proxy, "rich_proxied_file", None)
    moved: Moved = []
    if stream is None:  # not a live display's proxy: nothing to go above
        return moved
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (
            stream,
            sys.__stderr__,
        ):
            moved.append((handler, handler.setStream(proxy)))
    return moved


def _logs_back(moved: Moved) -> None:
    for handler, stream in moved:
        handler.setStream(stream)


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
        moved = _logs_above()
        try:
            yield Bar(progress, progress.add_task(description, total=total))
        finally:
            _logs_back(moved)


class _BuildView(logging.Handler):
    """The builder's lines as they are logged, kept for the live display (the last few)."""

    def __init__(self, description: str) -> None:
        super().__init__(logging.INFO)
        self.description = description
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)
        self.seen = threading.Event()
        self._started = time.monotonic()
        self._spinner = Spinner("dots", style="green")

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.seen.set()

    def __rich__(self) -> RenderableType:
        elapsed = int(time.monotonic() - self._started)
        self._spinner.update(text=f"{self.description} {elapsed // 60}:{elapsed % 60:02d}")
        tail = [
            Text(f"  {line}", style="dim", no_wrap=True, overflow="ellipsis")
            for line in list(self.lines)
        ]
        return Group(self._spinner, *tail)


@contextlib.contextmanager
def build_progress(description: str, *, eager: bool = True) -> Iterator[None]:
    """While the block runs, show the image builds it makes (the logger BUILD_LOG): on a
    terminal a spinner with the builder's last TAIL_LINES lines under it, replaced in place
    and removed at the end (`eager`: shown from the start, else from the first builder
    line); otherwise each builder line plain on stderr."""
    logger = logging.getLogger(BUILD_LOG)
    console = stderr_console()
    handler: logging.Handler
    if console.is_terminal:
        handler = view = _BuildView(description)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # not again through the root's "warning: " handler
    try:
        if not console.is_terminal:
            yield
            return
        with _live_when(view, console, eager):
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


@contextlib.contextmanager
def _live_when(view: _BuildView, console: Console, eager: bool) -> Iterator[None]:
    """The view live on the console from the start (`eager`) or from its first line."""
    live = Live(view, console=console, transient=True, refresh_per_second=8, redirect_stdout=False)
    lock = threading.Lock()
    ended = False
    moved: Moved = []

    def start() -> None:
        nonlocal moved
        with lock:
            if not ended:
                live.start()
                moved = _logs_above()

    def start_when_seen() -> None:
        view.seen.wait()  # set by the first line, or when the block ends
        start()

    waiter = None
    if eager:
        start()
    else:  # the builder runs in this thread: a helper starts the display for it
        waiter = threading.Thread(target=start_when_seen, daemon=True, name="orch-build-view")
        waiter.start()
    try:
        yield
    finally:
        with lock:
            ended = True
            view.seen.set()  # the waiter ends
            live.stop()
            _logs_back(moved)
        if waiter is not None:
            waiter.join(1.0)


ADMISSION_LOG = "orchestrator.admission"
"""The library's logger of spawns waiting for room (see orchestrator/services/admission.py)."""
PLAIN_EVERY = 10.0
"""Seconds between two plain progress lines about waiting for room, off a terminal."""


class _AdmissionView(logging.Handler):
    """The latest "waiting for room: ..." line: drawn in place on a terminal (in `bar`'s
    description when a bar is live, else a spinner of its own, gone once admitted), plain
    lines at most every PLAIN_EVERY seconds otherwise."""

    def __init__(self, console: Console, bar: Bar | None, description: str) -> None:
        super().__init__(logging.INFO)
        self.console, self.bar, self.description = console, bar, description
        self.live: Live | None = None
        self.spinner = Spinner("dots", style="yellow")
        self.guard = threading.Lock()
        self.printed = 0.0
        self.moved: Moved = []

    def emit(self, record: logging.LogRecord) -> None:
        line, done = record.getMessage(), bool(getattr(record, "admission_done", False))
        with self.guard:
            if not self.console.is_terminal:
                now = time.monotonic()
                if not done and now - self.printed >= PLAIN_EVERY:
                    self.printed = now
                    print(line, file=sys.stderr, flush=True)
            elif self.bar is not None:
                self.bar.describe(self.description if done else f"{self.description} ({line})")
            elif done:
                self.stop()
            else:
                self.spinner.update(text=line)
                if self.live is None:
                    self.live = Live(
                        self.spinner, console=self.console, transient=True, redirect_stdout=False
                    )
                    self.live.start()
                    self.moved = _logs_above()

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            _logs_back(self.moved)
            self.live, self.moved = None, []


@contextlib.contextmanager
def admission_progress(bar: Bar | None = None, description: str = "") -> Iterator[None]:
    """While the block runs, show spawns waiting for room on this host: "waiting for room:
    N ahead, X GiB of Y GiB admitted" (in `bar`, restored to `description` once admitted)."""
    logger = logging.getLogger(ADMISSION_LOG)
    view = _AdmissionView(stderr_console(), bar, description)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(view)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(view)
        logger.setLevel(level)
        logger.propagate = propagate
        with view.guard:
            view.stop()
