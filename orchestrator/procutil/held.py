"""A child process known before it exists (`Held`), and the signals that unwind the main
thread held while it is made (`deferred`).

A signal whose Python handler raises (Ctrl-C's KeyboardInterrupt, a CLI's SIGTERM and SIGHUP
exits, a harness's SIGALRM timeout) is run at the next bytecode of the main thread. Inside
Popen that may be right after the fork, before `self.pid` is set: the exception then leaves
a child no code can name to kill (CI: the docker CLI, under its `timeout`, lived on after a
Ctrl-C; under load the parent is often run again only after its child started). So while a
child is made, those handlers are swapped for one that notes the signal, and each signal
that came is acted on, once, in the order they came, when Popen returns; and `Held` puts
itself in its caller's list before it forks, so the caller's cleanup finds it wherever the
exception is raised. Blocking the signals instead would hand the mask down to the child.
Only the main thread runs Python's handlers: elsewhere `deferred` does nothing."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, Iterator, List, Tuple

UNWINDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)
"""Ctrl-C, a CLI's exit signals, and the alarm a harness times a call out with."""
Kept = List[Tuple[int, Callable[[int, Any], Any]]]


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """The handlers of UNWINDING held back for the body (see the module). Every handler
    swapped is put back, even when one run meanwhile raises (a signal left on the noting
    handler would never be acted on again); handlers set outside Python, SIG_DFL and SIG_IGN
    are left as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    kept: Kept = []

    def note(signum: int, frame: object) -> None:
        came.append(signum)

    try:
        for sig in UNWINDING:
            handler = signal.getsignal(sig)
            if callable(handler):
                kept.append((sig, handler))  # (before the swap: a signal between is its own)
                signal.signal(sig, note)
        yield
    finally:
        _put_back(kept)
        handlers = dict(kept)
        for signum in dict.fromkeys(came):  # (a handler that returns lets the next one run)
            handlers[signum](signum, sys._getframe())


def _put_back(kept: Kept) -> None:
    """Each handler put back, whatever a handler run meanwhile raises."""
    if kept:
        try:
            signal.signal(*kept[0])
        finally:
            _put_back(kept[1:])


class Held(subprocess.Popen):  # type: ignore[type-arg]
    """A Popen that puts itself in `held` before it makes its process, made with the
    unwinding signals held (`deferred`): whatever unwinds its caller, the caller finds it
    there (its `pid` unset: no process was made)."""

    def __init__(self, held: list[subprocess.Popen[bytes]], *args: Any, **kwargs: Any) -> None:
        held.append(self)
        with deferred():
            super().__init__(*args, **kwargs)
