"""What the caller of a started process (sandbox/process.py) holds on its command while it
runs, and what a backend's `_run` reads of it:

- `LiveInput`, the command's stdin as its caller writes it: an iterable a backend feeds from
  as it feeds any stdin, whose next chunk waits for the caller's next write, and which ends
  at the caller's close or once the command is gone. At most DEPTH chunks wait in it: a
  command that reads nothing makes its writer wait, never this process's memory grow;
- `Control`, how the caller signals or kills it: the backend binds the two actions once the
  command is sent (`bind`) and unbinds them when it ended (`unbind`); what is asked before
  the binding is held and done at it, what is asked after the end does nothing (a process
  id is never signalled once its command was reaped).

A backend that meets neither runs the command as before: `Command.control` is None and its
stdin bytes for every call but `start`."""

from __future__ import annotations

import contextlib
import queue
import signal as signals
import threading
from collections.abc import Callable, Iterator

from orchestrator.errors import ProcessEnded, UsageError

DEPTH = 16
"""Chunks written and not yet taken by the command that a LiveInput holds before `put`
waits."""
_TICK = 0.1
"""How often a waiting writer or feeder looks whether the command is gone."""
SIGNALS = frozenset(int(s) for s in signals.Signals) - {0}
"""The signals a caller may send (by number or `signal.Signals`): those this host knows."""


class LiveInput:
    """A command's stdin as its caller writes it (see the module)."""

    def __init__(self, depth: int = DEPTH, end: bytes = b"") -> None:
        self._end = end
        """Typed after what was written, at the close: a terminal's end of file (VEOF),
        which it has in place of a pipe's."""
        self._queue: queue.Queue[bytes | None] = queue.Queue(depth)
        self._closed = False
        self._gone = threading.Event()
        self._lock = threading.Lock()

    def put(self, data: bytes, timeout: float | None = None) -> None:
        """Hand `data` to the command, waiting while DEPTH chunks wait already (at most
        `timeout` s: TimeoutError). ProcessEnded once it ended, or its stdin was closed."""
        self._enqueue(data, timeout)

    def offer(self, data: bytes) -> bool:
        """`put` without waiting: False (nothing taken) where it would wait."""
        return self._enqueue(data, None, wait=False)

    def close(self) -> None:
        """The end of the command's input, after what was written; never waits (where no
        room is left, the feeder finds the end once it took the rest). Again: nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(queue.Full):  # (sooner than the feeder's next look)
            self._queue.put_nowait(None)

    def _enqueue(self, data: bytes, timeout: float | None, wait: bool = True) -> bool:
        """Queue `data` (False, with `wait` off, where there is no room now)."""
        if self._closed:
            raise ProcessEnded("its stdin was closed: nothing more can be written")
        waited = 0.0
        while data:
            if self._gone.is_set():
                raise ProcessEnded("the process has ended: nothing more can be written")
            try:
                self._queue.put(bytes(data), block=wait, timeout=_TICK)
            except queue.Full:
                if not wait:
                    return False
                waited += _TICK
                if timeout is not None and waited >= timeout:
                    raise TimeoutError(
                        f"the process read none of its input for {timeout:g}s"
                    ) from None
                continue
            if self._gone.is_set():  # taken into room its end made: nobody will read it
                self.gone()
                raise ProcessEnded("the process has ended: nothing more can be written")
            break
        return True

    def gone(self) -> None:
        """The command ended: writers waiting, and the feeder, stop; nothing is held."""
        self._gone.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                chunk = self._queue.get(timeout=_TICK)
            except queue.Empty:
                if self._gone.is_set():
                    return
                if self._closed:  # all taken, and no more will come
                    break
                continue
            if chunk is None:
                break
            yield chunk
        if self._end and not self._gone.is_set():
            yield self._end


Resize = Callable[[int, int], None]
"""A backend's way to set the command's terminal's size (columns, rows)."""
Act = Callable[[int], None]
"""A backend's way to send one signal to the command's process group (the kill: SIGKILL to
its whole tree)."""


class Control:
    """How the caller of a started command signals or kills it (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._signal: Act | None = None
        self._kill: Callable[[], object] | None = None
        self._held: list[int] = []
        self._kill_held = False
        self._ended = False
        self._resize: Resize | None = None
        self._size: tuple[int, int] | None = None  # the last size asked before the binding
        self.lost = 0
        """Output bytes a kept process's scrollback dropped before they reached us."""
        self.base = 0
        """Where in a kept process's output this reader started."""
        self.detached = False
        self._hang_up: Callable[[], object] | None = None

    def bind(self, signal: Act, kill: Callable[[], object], resize: Resize | None = None) -> None:
        """The backend sent the command: from now on signals, kills and (for one on a
        terminal) resizes go to it; what was asked before is done now."""
        with self._lock:
            if self._ended:
                return
            self._signal, self._kill, self._resize = signal, kill, resize
            if resize is not None and self._size is not None:
                resize(*self._size)
            for sig in self._held:
                signal(sig)
            self._held = []
            if self._kill_held:
                kill()

    def resize(self, cols: int, rows: int) -> None:
        """Set the size of the command's terminal; nothing once it ended."""
        self._followed()
        with self._lock:
            if self._resize is not None:
                self._resize(cols, rows)
            elif not self._ended:
                self._size = (cols, rows)  # the last one asked is the one that counts

    def _followed(self) -> None:
        if self.detached:
            raise UsageError(
                "this Process was detached from its kept process: Sandbox.process(id) reads "
                "(and signals, kills, resizes) it again"
            )

    def detach(self) -> None:
        """Stop following a kept process (it runs on): its connection is closed."""
        with self._lock:
            self.detached = True
            hang_up = self._hang_up
        if hang_up is not None:
            hang_up()

    def on_detach(self, hang_up: Callable[[], object]) -> None:
        """How the backend closes a kept process's connection once what it asked was sent
        (at once, if `detach` came before)."""
        with self._lock:
            self._hang_up = hang_up
            now = self.detached
        if now:
            hang_up()

    def unbind(self) -> None:
        """The command ended: nothing more is sent to its process ids (a signal being sent
        is waited for: none goes out after this returns)."""
        with self._lock:
            self._ended = True
            self._signal = self._kill = self._resize = None

    def signal(self, sig: int) -> None:
        """Send `sig` to the command's process group; nothing once it ended."""
        if isinstance(sig, bool) or not isinstance(sig, int) or int(sig) not in SIGNALS:
            raise UsageError(f"not a signal: {sig!r} (give a number or a signal.Signals)")
        self._followed()
        with self._lock:
            if self._signal is not None:
                self._signal(int(sig))
            elif not self._ended and int(sig) not in self._held:
                self._held.append(int(sig))  # pending once, as the kernel holds a signal

    def kill(self) -> None:
        """Kill the command's whole tree; nothing once it ended."""
        self._followed()
        with self._lock:
            if self._kill is not None:
                self._kill()
            elif not self._ended:
                self._kill_held = True
