"""`orchestrator top`: this user's environments as a live table (Rich), with what each costs
now: CPU (a percentage of one CPU, between two readings), memory, processes and egress, and
what its main sandbox runs now (its newest process), read from outside their owners
(`environments(usage=True)`). On a terminal, keys: `s` sorts by the next column, `j`/`k` (or
the arrows) move the selection (it stays on its environment when the rows re-sort), `d` then
`y` takes the selected one down as `orchestrator down` would (one still used by its owner is
refused, said in the last line), `q` quits. `--once` prints one table (or `--json`) from two
readings `--interval` apart, for scripts.

Keys are read in cbreak mode (not raw: Ctrl-C still interrupts), restored on the way out."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import typer

from orchestrator.errors import OrchestratorError
from orchestrator.tables import egress_text, printable, size_text

if TYPE_CHECKING:
    from rich.console import Group

    from orchestrator import EnvironmentStatus

SORTS = ("cpu", "memory", "age", "id")
HEADERS = (
    "ID",
    "ENV",
    "STATE",
    "AGE",
    "CPU %",
    "MEMORY",
    "PEAK",
    "PIDS",
    "EGRESS",
    "OWNER",
    "COMMAND",
)


@dataclass(frozen=True)
class Row:
    """One environment as `top` shows it (and `--json` prints it)."""

    id: str
    env: str
    state: str
    owner: str
    age_seconds: float | None
    cpu_percent: float | None
    """Of one CPU, between this reading and the last (None: no earlier reading)."""
    cpu_seconds: float
    memory_bytes: int
    memory_peak_bytes: int
    pids: int
    egress_allowed: int | None
    egress_denied: int | None
    egress_complete: bool
    """False when the gateway's log lost lines before they were read: the counts are short."""
    command: str
    """What its main sandbox runs now: its newest process's command line ("" for none)."""


class Readings:
    """Successive listings, each row's CPU % from the one before."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._last: dict[str, tuple[float, float]] = {}  # id -> (when, cpu seconds)
        self._say = say

    def take(self) -> list[Row]:
        from orchestrator import environments

        rows, removed = environments(usage=True)
        now = time.monotonic()
        for name in removed:
            self._say(f"removed {name} (its owner process is gone)")
        out = [self._row(status, now) for status in rows]
        self._last = {r.id: (now, r.cpu_seconds) for r in out}
        return out

    def _row(self, status: EnvironmentStatus, now: float) -> Row:
        usage = status.usage
        total = usage.total if usage is not None else None
        cpu = total.cpu_seconds if total is not None else 0.0
        before = self._last.get(status.id)
        percent = None
        if before is not None and now > before[0] and total is not None:
            percent = max(0.0, (cpu - before[1]) / (now - before[0]) * 100)
        egress = usage.egress if usage is not None else None
        return Row(
            id=status.id,
            env=status.env,
            state=status.state,
            owner=status.owner,
            age_seconds=_age(status.started),
            cpu_percent=percent,
            cpu_seconds=cpu,
            memory_bytes=total.memory_bytes if total is not None else 0,
            memory_peak_bytes=total.memory_peak_bytes if total is not None else 0,
            pids=total.pids if total is not None else 0,
            egress_allowed=egress.allowed if egress is not None else None,
            egress_denied=egress.denied if egress is not None else None,
            egress_complete=egress.complete if egress is not None else True,
            command=status.command,
        )


def _age(started: str) -> float | None:
    try:
        when = datetime.strptime(started, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    return max(0.0, (datetime.now(UTC) - when).total_seconds())


def sorted_rows(rows: list[Row], key: str) -> list[Row]:
    if key == "id":
        return sorted(rows, key=lambda r: r.id)
    if key == "age":
        return sorted(rows, key=lambda r: -(r.age_seconds or 0))
    if key == "memory":
        return sorted(rows, key=lambda r: (-r.memory_bytes, r.id))
    return sorted(rows, key=lambda r: (-(r.cpu_percent or 0), -r.cpu_seconds, r.id))


def _age_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def cells(row: Row) -> list[str]:
    return [
        printable(c)
        for c in (
            row.id,
            row.env,
            row.state,
            _age_text(row.age_seconds),
            "-" if row.cpu_percent is None else f"{row.cpu_percent:.1f}",
            size_text(row.memory_bytes),
            size_text(row.memory_peak_bytes),
            str(row.pids),
            egress_text(row.egress_allowed, row.egress_denied, row.egress_complete),
            row.owner,
            row.command or "-",
        )
    ]


def top(
    once: bool = typer.Option(False, "--once", help="Print one table (two readings) and exit."),
    as_json: bool = typer.Option(False, "--json", help="With --once: JSON, one object each."),
    interval: float = typer.Option(
        2.0, "--interval", "-n", min=0.2, max=3600, help="Seconds between readings."
    ),
    sort: str = typer.Option("cpu", "--sort", help=f"Sort by: {', '.join(SORTS)}."),
) -> None:
    """A live table of this user's environments and what each costs now: CPU, memory,
    processes, egress (allowed/denied requests). Keys: s sort, j/k select, d y down, q quit."""
    from orchestrator.errors import UsageError

    if sort not in SORTS:
        raise UsageError(f"--sort takes one of {', '.join(SORTS)}, not {sort!r}")
    if as_json and not once:
        raise UsageError("--json prints one reading: give --once too")
    if once:
        readings = Readings(lambda text: typer.echo(text, err=True))
        readings.take()
        time.sleep(interval)
        rows = sorted_rows(readings.take(), sort)
        if as_json:
            typer.echo(json.dumps([r.__dict__ for r in rows]))
            return
        from orchestrator.tables import print_table

        print_table(
            HEADERS, [cells(r) for r in rows], drop=("COMMAND", "OWNER", "EGRESS", "PEAK", "ENV")
        )
        return
    _live(interval, sort)


def _live(interval: float, sort: str) -> None:
    from rich.console import Console
    from rich.live import Live

    console = Console()
    view = View(sort)
    readings = Readings(view.say)  # (under a live table: said on its last line)
    quiet = logging.getLogger("orchestrator")
    with contextlib.ExitStack() as stack:
        stack.callback(quiet.setLevel, quiet.level)
        quiet.setLevel(logging.ERROR)  # (a warning printed under a live table would tear it)
        keys = stack.enter_context(_keys())
        live = stack.enter_context(Live(console=console, auto_refresh=False, screen=False))
        rows = readings.take()
        next_reading = time.monotonic() + interval
        while True:
            live.update(view.render(rows, interval), refresh=True)
            wait = max(0.0, next_reading - time.monotonic())
            key = keys(wait)
            if key == "q":
                return
            if key:
                view.press(key, rows)
            if time.monotonic() >= next_reading or (key == "y" and view.message):
                rows = readings.take()
                next_reading = time.monotonic() + interval


class View:
    """What the live table shows: its order, the selected environment (by id: a re-sort
    never moves the selection onto another), the last line's message, and a take-down
    waiting for its `y`."""

    def __init__(self, sort: str) -> None:
        self.sort = sort
        self.selected = ""
        self.message = ""
        self.pending = ""

    def say(self, text: str) -> None:
        self.message = text

    def index(self, shown: list[Row]) -> int:
        ids = [r.id for r in shown]
        return ids.index(self.selected) if self.selected in ids else 0

    def press(self, key: str, rows: list[Row]) -> None:
        shown = sorted_rows(rows, self.sort)
        pending, self.pending = self.pending, ""
        if pending and key == "y":
            from orchestrator import remove_environment

            try:
                # (by its whole id: one gone meanwhile never names another by a prefix)
                self.message = f"removed {remove_environment(pending, exact=True)}"
            except OrchestratorError as exc:
                self.message = f"{pending}: {exc}"
            return
        if pending:
            self.message = "not taken down"
        at = self.index(shown)
        if key == "s":
            self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        elif key in ("j", "down") and shown:
            self.selected = shown[min(at + 1, len(shown) - 1)].id
        elif key in ("k", "up") and shown:
            self.selected = shown[max(at - 1, 0)].id
        elif key == "d" and shown:
            self.pending = shown[at].id
            self.message = f"take {self.pending} down? y to confirm, any other key not"

    def render(self, rows: list[Row], interval: float) -> Group:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        shown = sorted_rows(rows, self.sort)
        at = self.index(shown)
        self.selected = shown[at].id if shown else ""
        table = Table(box=None, pad_edge=False, header_style="bold")
        for header in HEADERS:
            table.add_column(header, no_wrap=True, overflow="ellipsis")  # (a line each)
        for i, row in enumerate(shown):
            table.add_row(*(Text(c) for c in cells(row)), style="reverse" if i == at else "")
        head = Text(
            f"{len(shown)} environments, every {interval:g}s, sorted by {self.sort}"
            "   s sort  j/k select  d y down  q quit"
        )
        return Group(head, table, Text(printable(self.message)))


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str | None]]:
    """A reader of one key press within a timeout (None: none), from a terminal on stdin in
    cbreak mode (restored after); without one, a timer that reads nothing."""
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd < 0 or not os.isatty(fd):

        def sleep(timeout: float) -> str | None:
            time.sleep(timeout)
            return None

        yield sleep
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        pending: list[str] = []

        def read(timeout: float) -> str | None:
            if not pending:
                ready, _, _ = select.select([fd], [], [], timeout)
                if not ready:
                    return None
                pending.extend(_split(os.read(fd, 64).decode(errors="replace")))
            return pending.pop(0) if pending else None

        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


_ARROWS = {"\x1b[A": "up", "\x1b[B": "down", "\x1bOA": "up", "\x1bOB": "down"}


def _split(data: str) -> list[str]:
    """The keys in what one read got: arrows (their escape sequences) and characters."""
    keys = []
    while data:
        arrow = next((seq for seq in _ARROWS if data.startswith(seq)), None)
        keys.append(_ARROWS[arrow] if arrow else data[0])
        data = data[len(arrow) if arrow else 1 :]
    return keys
