"""A process you can talk to: `Sandbox.start` runs a command through the place's `_run`, as
every other call does, and hands back a `Process` while it runs. Its caller writes its stdin
as it goes, reads its output as it comes (stdout and stderr apart, the events `stream`
gives), signals or kills it, and waits for the same result `execute` gives.

One thread per process drives the backend's `_run` (a generator) to its end: the output
events wait in a queue of at most AHEAD events, so a caller that reads nothing stops the
command's output (the backend's own flow control: a pipe, or the executor's credit), never
this process's memory growing. `wait()` reads what is left itself. The result keeps the last
`output_limit` bytes of each stream, as `execute` does, whoever read the events.

The command's `timeout` kills its whole tree as for `execute`, with its stdin open or not; a
process ends with its environment (the executor, or the local backend's cleanup, kills every
command)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from orchestrator import procutil
from orchestrator.errors import ExecutorLost, UsageError
from orchestrator.sandbox.call import Events
from orchestrator.sandbox.live import Control, LiveInput
from orchestrator.sandbox.results import RuntimeResult, StreamEvent

if TYPE_CHECKING:
    from orchestrator.sandbox.options import Chunks, Command

AHEAD = 64
"""Output events a process holds for a caller who has not read them; then its output waits."""
KILL_WAIT = 10.0
"""Longest leaving a `with` block waits for a killed process to end."""


class Process:
    """A command started by `Sandbox.start`, running (see the module). Iterating it yields
    its output events as they come and, last, a "finished" event with the result; it may be
    iterated again after a `break` (each event goes to one reader). As a context manager, it
    is killed on leaving unless it ended."""

    def __init__(self, run: Callable[[Command], Chunks], cmd: Command, events: Events) -> None:
        assert cmd.control is not None
        self._input = cmd.stdin if isinstance(cmd.stdin, LiveInput) else None
        self.tty = cmd.tty is not None
        """Whether it runs on a terminal of its own (its output then all "stdout")."""
        self._control: Control = cmd.control
        self._events = events
        self._queue: list[StreamEvent] = []
        self._cond = threading.Condition()
        self._finished: StreamEvent | None = None
        self._error: BaseException | None = None
        self._draining = False
        self._watchers: list[Callable[[], None]] = []
        procutil.in_thread(lambda: self._pump(run, cmd))

    # ----- the pump: the backend's generator, driven to its end in a thread of its own -------
    def _pump(self, run: Callable[[Command], Chunks], cmd: Command) -> None:
        last: list[StreamEvent] = []
        try:
            gen = run(cmd)
            try:
                while True:
                    try:
                        kind, data = next(gen)
                    except StopIteration as stop:
                        last = self._events.finish(stop.value)
                        break
                    event = self._events.add(kind, data)
                    if event is not None:
                        self._hand(event)
            finally:
                gen.close()
        except BaseException as exc:  # the caller's to see, at its next read or wait
            self._error = exc
        finally:
            self._control.unbind()
            if self._input is not None:
                self._input.gone()
        for event in last[:-1]:  # a decoder's last characters
            self._hand(event)
        with self._cond:
            self._finished = last[-1] if last else None
            self._cond.notify_all()
        self._wake()

    def _hand(self, event: StreamEvent) -> None:
        """Queue an event for the caller, waiting while AHEAD wait already (unless `wait`
        reads them: then it is dropped, its bytes kept in the result's tail)."""
        with self._cond:
            while len(self._queue) >= AHEAD and not self._draining:
                self._cond.wait()
            if not self._draining:
                self._queue.append(event)
                self._cond.notify_all()
        self._wake()

    def _wake(self) -> None:
        for watcher in list(self._watchers):
            watcher()

    def watch(self, wake: Callable[[], None]) -> None:
        """Call `wake` (from the pump's thread) whenever an event is queued or the process
        ended: how orchestrator.aio waits for one without a thread of its own."""
        self._watchers.append(wake)
        wake()

    # ----- reading --------------------------------------------------------------------------
    @property
    def ended(self) -> bool:
        """Whether the command ended (its "finished" event may still be unread)."""
        return self._finished is not None or self._error is not None

    def read(self, timeout: float | None = None) -> StreamEvent | None:
        """The next output event (the "finished" one last, and again on each later read);
        None when none came within `timeout` seconds (None: wait for one). Raises what ended
        the call, where it could not run to its end (the sandbox went away)."""
        with self._cond:
            if not self._cond.wait_for(self._ready, timeout):
                return None
            if self._queue:
                event = self._queue.pop(0)
                self._cond.notify_all()
                return event
        return self._last()

    def _ready(self) -> bool:
        return bool(self._queue) or self.ended

    def _last(self) -> StreamEvent:
        if self._error is not None:
            raise self._error
        if self._finished is None:  # (a pump that ended without an outcome: never silent)
            raise ExecutorLost("the command's output ended without its exit status")
        return self._finished

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
        self.drop_unread()
        with self._cond:
            if not self._cond.wait_for(lambda: self.ended, timeout):
                self._draining = False
                raise TimeoutError(f"the process did not end within {timeout:g}s")
        result = self._last().result
        assert result is not None
        return result

    def drop_unread(self) -> None:
        """From now on nobody reads its events (`wait` does this): those queued and those to
        come are dropped, their bytes kept in the result; its output no longer waits."""
        with self._cond:
            self._draining = True
            self._queue.clear()
            self._cond.notify_all()

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
        """End its input: it reads end of file after what was written."""
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
        if not self.ended:
            self.kill()
        self.drop_unread()
        with self._cond:
            self._cond.wait_for(lambda: self.ended, KILL_WAIT)


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
