"""Ctrl-P Ctrl-Q on an interactive terminal (`exec -it`, `shell`): the way out of a command
that takes every other key. Our terminal is raw meanwhile, so Ctrl-C, Ctrl-\\ and Ctrl-Z are
keys typed into the command's terminal, which a command may ignore; these two, typed one
after the other, are never passed on: the session ends as an interrupt ends it (the
command killed with our connection, exit 130). A Ctrl-P alone is passed on with the next
key typed (it waits to see which one). Standard library only: the endpoint's quick path
loads this."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

KEYS = b"\x10\x11"
"""Ctrl-P, then Ctrl-Q."""
SAID = "\r\nleft on Ctrl-P Ctrl-Q: the command was killed\r\n"


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
