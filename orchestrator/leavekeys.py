"""Ctrl-P Ctrl-Q on an interactive terminal (`exec -it`, `shell`): the way out of a command
that takes every other key. Our terminal is raw meanwhile, so Ctrl-C, Ctrl-\\ and Ctrl-Z are
keys typed into the command's terminal, which a command may ignore; these two, typed one
after the other on our terminal (never in a pipe's bytes), are never passed on: the
session ends as an interrupt ends it (the command killed with our connection, exit 130),
also where we were started with SIGINT ignored. A Ctrl-P alone is passed on with the next
key typed (it waits to see which one). Standard library only: the endpoint's quick path
loads this."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

KEYS = b"\x10\x11"
"""Ctrl-P, then Ctrl-Q."""
SAID = "\r\nleft on Ctrl-P Ctrl-Q: the command was killed\r\n"


def watch_for(fd: int) -> Watch | None:
    """A watch of our stdin's bytes where it is our terminal; None for a pipe or a file
    (its bytes are the command's input, whatever they are)."""
    try:
        return Watch() if os.isatty(fd) else None
    except OSError:
        return None


@contextlib.contextmanager
def armed(on: bool) -> Iterator[None]:
    """While an `-it` session runs (`on`; from the main thread): SIGINT raises
    KeyboardInterrupt, how `leave` ends it, even where we were started with it ignored
    (a terminal in raw mode sends none of its own meanwhile)."""
    if not on or threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


class Watch:
    """Our stdin's bytes, as read, with the keys looked for across reads."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """What of `data` to pass on, and whether the keys were typed (then what came
        before them only)."""
        data, self._held = self._held + data, b""
        at = data.find(KEYS)
        if at >= 0:
            return data[:at], True
        if data.endswith(KEYS[:1]):
            data, self._held = data[:-1], KEYS[:1]
        return data, False


def leave() -> None:
    """End the session from the thread that feeds it: said on our terminal, then SIGINT to
    the main thread (so that a wait it is blocked in ends), which unwinds as Ctrl-C does
    without a terminal."""
    with contextlib.suppress(OSError):
        os.write(2, SAID.encode())
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
