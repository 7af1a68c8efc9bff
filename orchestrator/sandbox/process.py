"""A process you can talk to: `Sandbox.start` runs a command through the place's `_run`, as
every other call does, and hands back a `Process` while it runs. Its caller writes its stdin
as it goes, reads its output as it comes (stdout and stderr apart, the events `stream`
gives), signals or kills it, and waits for the same result `execute` gives.

One thread per process drives the backend's `_run` (a generator) to its end: the output
events wait in a queue of at most AHEAD bytes, so a caller that reads nothing stops the
command's output (the backend's own flow control: a pipe, or the executor's credit), never
this process's memory growing. `wait()` reads what is left itself. The result keeps the last
`output_limit` bytes of each stream, as `execute` does, whoever read the events.

The command's `timeout` kills its whole tree as for `execute`, with its stdin open or not; a
process ends with its environment (the executor, or the local backend's cleanup, kills every
command)."""

from __future__ import annotations

import contextlib
import re
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from orchestrator import procutil
from orchestrator.errors import ExecutorLost, UsageError
from orchestrator.sandbox.call import Events
from orchestrator.sandbox.live import Control, LiveInput
from orchestrator.sandbox.results import RuntimeResult, StreamEvent

if TYPE_CHECKING:
    from orchestrator.sandbox.options import Chunks, Command

AHEAD = 1 << 20
"""Bytes of output events a process holds for a caller who has not read them (at least one
event); then its output waits."""
KILL_WAIT = 10.0
"""Longest leaving a `with` block waits for a killed process to end."""
LOOK = 1.0
"""How often output waiting for its reader looks whether the sandbox is still usable."""
KEPT_ID = re.compile(r"[0-9a-f]{32}")
"""A kept process's id (`Process.id`)."""


class _Outlet:
    """The output side of a process, which its pump thread drives: the backend's generator
    run to its end, its events queued (at most AHEAD bytes) for the reader. The thread holds this,
    never the Process, so a Process its caller dropped is collected (and let go)."""

    def __init__(self, events: Events, usable: Callable[[], object], control: Control) -> None:
        self.events = events
        self.usable = usable
        self.control = control
        self.cursor: int | None = None
        """Offset in the output (both streams' bytes, counted together) after the events
        handed out (read, or dropped unread); None before the first."""
        self.got = 0  # bytes received
        self.ends: list[int] = []  # the offset after each queued event
        self.queue: list[StreamEvent] = []
        self.queued = 0  # bytes of the events in `queue`
        self.cond = threading.Condition()
        self.finished: StreamEvent | None = None
        self.error: BaseException | None = None
        self.draining = False
        self.watchers: list[Callable[[], None]] = []

    @property
    def ended(self) -> bool:
        return self.finished is not None or self.error is not None

    def pump(
        self,
        run: Callable[[Command], Chunks],
        cmd: Command,
        control: Control,
        stdin: LiveInput | None,
    ) -> None:
        last: list[StreamEvent] = []
        try:
            gen = run(cmd)
            try:
                while True:
                    try:
                        kind, data = next(gen)
                    except StopIteration as stop:
                        last = self.events.finish(stop.value)
                        break
                    self.got += len(data)
                    event = self.events.add(kind, data)
                    if event is not None:
                        self.hand(event, self.offset())
            finally:
                gen.close()
        except BaseException as exc:  # the caller's to see, at its next read or wait
            self.error = exc
        finally:
            control.unbind()
            if stdin is not None:
                stdin.gone()
        for event in last[:-1]:  # a decoder's last characters
            self.hand(event, self.offset())
        with self.cond:
            self.finished = last[-1] if last else None
            self.cond.notify_all()
        self.wake()

    def offset(self) -> int:
        """Where in the output what was received ends."""
        return self.control.base + self.got + self.control.lost

    def hand(self, event: StreamEvent, end: int) -> None:
        """Queue an event for the reader, waiting while AHEAD bytes wait already: unless nobody
        reads any more (`drop_unread`), or the sandbox was removed meanwhile (its command is
        gone: what is left of its output is drained, not waited on). A dropped event's
        bytes are in the result's tail."""
        with self.cond:
            while self.queued >= AHEAD and not self.draining:
                if not self.cond.wait(LOOK) and not self._still_usable():
                    self.draining = True
            if not self.draining:
                self.queue.append(event)
                self.ends.append(end)
                self.queued += len(event.data)
                self.cond.notify_all()
            else:
                self.cursor = end
        self.wake()

    def _still_usable(self) -> bool:
        try:
            self.usable()
        except Exception:  # RuntimeClosed: removed
            return False
        return True

    def wake(self) -> None:
        for watcher in list(self.watchers):
            watcher()

    def take(self) -> StreamEvent:
        """The first queued event (the caller holds `cond` and saw one queued)."""
        event = self.queue.pop(0)
        self.cursor = self.ends.pop(0)
        self.queued -= len(event.data)
        self.cond.notify_all()
        return event

    def drop_unread(self) -> None:
        with self.cond:
            self.draining = True
            if self.ends:
                self.cursor = self.ends[-1]
            self.queue.clear()
            self.ends.clear()
            self.queued = 0
            self.cond.notify_all()


def _let_go(
    outlet: _Outlet, stdin: LiveInput | None, control: Control, tty: bool, kept: bool
) -> None:
    """A Process its caller dropped: nobody reads its output or writes its input any more,
    as when a pipe's other end is closed: its input ends, its output is drained into the
    tail nobody will see, and it runs to its end (or its timeout). One on a terminal is
    killed, as a terminal's hang-up ends its session: nobody can type into it any more.
    A kept one is only let go of (`detach`): it runs on for whoever reads it next."""
    outlet.drop_unread()
    if kept:
        control.detach()
        return
    if stdin is not None:
        stdin.close()
    if tty:
        control.kill()


class Process:
    """A command started by `Sandbox.start`, running (see the module). Iterating it yields
    its output events as they come and, last, a "finished" event with the result; it may be
    iterated again after a `break` (each event goes to one reader). As a context manager, it
    is killed on leaving unless it ended. Dropped without either, its input ends (as a
    pipe's when its writer goes) and its output is no longer kept for anyone."""

    def __init__(
        self,
        run: Callable[[Command], Chunks],
        cmd: Command,
        events: Events,
        usable: Callable[[], object] = lambda: None,
        *,
        writable: bool = True,
    ) -> None:
        assert cmd.control is not None
        stdin = cmd.stdin if isinstance(cmd.stdin, LiveInput) else None
        self._input = stdin if writable else None
        self.tty = cmd.tty is not None
        """Whether it runs on a terminal of its own (its output then all "stdout")."""
        self._control: Control = cmd.control
        self.id = cmd.keep
        """A kept process's id (`start(..., keep=True)`), for `Sandbox.process`; else None."""
        cmd.control.base = cmd.attach or 0
        out = self._out = _Outlet(events, usable, cmd.control)
        control = cmd.control
        kept = cmd.keep is not None
        weakref.finalize(self, _let_go, out, stdin, control, self.tty, kept)
        procutil.in_thread(lambda: out.pump(run, cmd, control, stdin))

    def watch(self, wake: Callable[[], None]) -> None:
        """Call `wake` (from the pump's thread) whenever an event is queued or the process
        ended: how orchestrator.aio waits for one without a thread of its own. `wake` must
        not hold the Process (a dropped one is let go)."""
        self._out.watchers.append(wake)
        wake()

    # ----- reading --------------------------------------------------------------------------
    @property
    def cursor(self) -> int:
        """Where its reader is in its output (both streams' bytes counted together from its
        start, what a kept process's scrollback dropped included): a kept one's
        `Sandbox.process(id, cursor=...)` goes on from there."""
        out = self._out
        with out.cond:
            if out.ended and not out.queue:
                return out.offset()
            return out.control.base if out.cursor is None else out.cursor

    def detach(self) -> None:
        """A kept process: stop following it, leaving it running (`Sandbox.process(id)`
        reads it again); reading this Process afterwards raises UsageError. Nothing for
        another process (kill it, or wait for it)."""
        if self.id is not None:
            self._control.detach()

    @property
    def ended(self) -> bool:
        """Whether the command ended (its "finished" event may still be unread)."""
        return self._out.ended

    def read(self, timeout: float | None = None) -> StreamEvent | None:
        """The next output event (the "finished" one last, and again on each later read);
        None when none came within `timeout` seconds (None: wait for one). Raises what ended
        the call, where it could not run to its end (the sandbox went away)."""
        out = self._out
        with out.cond:
            if not out.cond.wait_for(lambda: bool(out.queue) or out.ended, timeout):
                return None
            if out.queue:
                return out.take()
        return self._last()

    def _last(self) -> StreamEvent:
        if self._out.error is not None:
            raise self._out.error
        if self._out.finished is None:  # (a pump that ended without an outcome: never silent)
            raise ExecutorLost("the command's output ended without its exit status")
        return self._out.finished

    def __iter__(self) -> Iterator[StreamEvent]:
        while True:
            event = self.read()
            assert event is not None
            yield event
            if event.kind == "finished":
                return

    def wait(self, timeout: float | None = None) -> RuntimeResult:
        """The command's result once it ended, as `execute` gives it (the events nobody read
        are dropped; their bytes are in the result). TimeoutError past `timeout` seconds (the
        process runs on: its own `timeout` is what kills it)."""
        out = self._out
        with self.draining(), out.cond:
            if not out.cond.wait_for(lambda: out.ended, timeout):
                raise TimeoutError(f"the process did not end within {timeout:g}s")
        result = self._last().result
        assert result is not None
        return result

    @contextlib.contextmanager
    def draining(self) -> Iterator[None]:
        """Its events dropped while the block runs (a wait: nobody reads them meanwhile),
        and kept again for a reader after it, unless `drop_unread` was called before."""
        out = self._out
        with out.cond:
            dropped = out.draining
        self.drop_unread()
        try:
            yield
        finally:
            with out.cond:
                out.draining = dropped

    def drop_unread(self) -> None:
        """From now on nobody reads its events (`wait` does this): those queued and those to
        come are dropped, their bytes kept in the result; its output no longer waits."""
        self._out.drop_unread()

    # ----- talking to it --------------------------------------------------------------------
    def write(self, data: str | bytes, *, timeout: float | None = None) -> None:
        """Write to its stdin (text as UTF-8), waiting while it has not read what came before
        (at most `timeout` s: TimeoutError). ProcessEnded once it ended or its stdin was
        closed."""
        self._stdin().put(_bytes(data), timeout)

    def offer(self, data: str | bytes) -> bool:
        """`write` without waiting: False, and nothing written, where it would wait."""
        return self._stdin().offer(_bytes(data))

    def _stdin(self) -> LiveInput:
        if self._input is None:
            raise UsageError("this process was started with stdin=False: nothing can be written")
        return self._input

    def close_stdin(self) -> None:
        """End its input: it reads end of file after what was written (on a terminal, Ctrl-D
        is typed: a line not ended yet is then read first, and the end at the next read)."""
        if self._input is not None:
            self._input.close()

    def signal(self, sig: int) -> None:
        """Send `sig` (a number or `signal.Signals`) to its process group: SIGINT as Ctrl-C
        would. Nothing once it ended."""
        self._control.signal(sig)

    def kill(self) -> None:
        """Kill its whole tree (its result says 137). Nothing once it ended."""
        self._control.kill()

    def resize(self, cols: int, rows: int) -> None:
        """Set its terminal's size (started with `tty=True`): what it reads of its terminal
        from now on, and SIGWINCH to its foreground group. Nothing once it ended."""
        if not self.tty:
            raise UsageError("this process has no terminal to resize: start it with tty=True")
        self._control.resize(*terminal_size(cols, rows))

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.ended and not self._control.detached:
            self.kill()
        self.drop_unread()
        out = self._out
        with out.cond:
            out.cond.wait_for(lambda: out.ended, KILL_WAIT)


def _bytes(data: str | bytes) -> bytes:
    if isinstance(data, str):
        return data.encode()
    if not isinstance(data, bytes | bytearray | memoryview):
        raise UsageError(f"write takes str or bytes, not {type(data).__name__}")
    return bytes(data)


def terminal_size(cols: int, rows: int) -> tuple[int, int]:
    """(cols, rows) of a terminal, or UsageError: whole numbers from 1 to LARGEST."""
    for name, value in (("cols", cols), ("rows", rows)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 0 < value <= procutil.LARGEST
        ):
            raise UsageError(
                f"{name} must be a whole number from 1 to {procutil.LARGEST}, not {value!r}"
            )
    return cols, rows
