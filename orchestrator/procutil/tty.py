"""A command on a terminal of its own: a pseudo-terminal pair made here, the command started
on its slave side (stdin, stdout and stderr: one stream, as on a terminal) as its session's
controlling terminal, so Ctrl-C typed into it reaches its foreground group; the master side
read as its output and written with its input; a resize (TIOCSWINSZ) sends SIGWINCH to its
foreground group. Standard library only, Python 3.7+.

The terminal is made the controlling one by a few lines of Python run first (`CTTY`, by the
interpreter running this code, isolated): Popen has no safe hook for it in a process with
threads, and a session leader's open of a terminal, the other way, depends on the program
that opens it.
"""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import termios
import threading
from typing import TYPE_CHECKING, Callable, Dict, Generator, Iterable, List, Optional, Tuple

from .base import Outcome
from .pump import run
from .workers import in_thread

if TYPE_CHECKING:
    from .base import Chunk, Spawn

CTTY = (
    "import errno, fcntl, os, sys, termios\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "os.tcsetpgrp(0, os.getpgrp())\n"
    "os.dup2(0, 2)\n"
    "try:\n"
    "    os.execvp(sys.argv[1], sys.argv[1:])\n"
    "except OSError as e:\n"
    "    sys.stderr.write('%s: %s\\n' % (sys.argv[1], e.strerror)); sys.stderr.flush()\n"
    "    os._exit(127 if e.errno == errno.ENOENT else 126)\n"
)
"""Run as `python -I -c CTTY ARGV...` on the slave side, in a new session (isolated: nothing
is imported from the command's folder, PYTHONPATH or a user site, which the sandbox may
write): take the terminal as the controlling one with its group in the foreground (Linux
does that itself), put stderr on it too, then become the command (127 or 126 as a shell
says them when it cannot)."""
VEOF = b"\x04"
"""What a terminal's input ends with (Ctrl-D, at the start of a line: the end of file)."""
LARGEST = 65535
"""Most columns or rows a terminal may have (the kernel keeps each in 16 bits)."""


class Tty:
    """One pseudo-terminal pair of a command. Resizes and the close hold one lock, so a
    resize never lands on a descriptor number reused after the close."""

    def __init__(self, cols: int, rows: int) -> None:
        self.master, self.slave = os.openpty()
        self._lock = threading.Lock()
        self._closed = False
        self.resize(cols, rows)

    def resize(self, cols: int, rows: int) -> None:
        """Set its size (the command's foreground group gets SIGWINCH); nothing once closed."""
        if not (0 < cols <= LARGEST and 0 < rows <= LARGEST):
            return
        with self._lock:
            if not self._closed:
                try:
                    fcntl.ioctl(
                        self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0)
                    )
                except OSError:
                    pass

    def writer(self) -> Optional[int]:
        """A descriptor of its own for whoever writes the command's input (closed by it)."""
        with self._lock:
            return None if self._closed else os.dup(self.master)

    def drop_slave(self) -> None:
        """The command holds the slave side now: ours goes, so its end is the command's."""
        with self._lock:
            if self.slave >= 0:
                os.close(self.slave)
                self.slave = -1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for fd in (self.master, self.slave):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            self.master = self.slave = -1


def _feed(fd: int, chunks: Iterable[bytes]) -> None:
    """The command's input, written to the terminal as it comes (echoed by it, as typed)."""
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
    except OSError:
        pass  # the terminal is gone: the command ended
    finally:
        os.close(fd)


def run_tty(
    argv: List[str],
    env: Optional[Dict[str, str]],
    cwd: Optional[str],
    user: Optional[str],
    stdin: Optional[Iterable[bytes]],
    timeout: Optional[float],
    size: Tuple[int, int],
    on_start: Optional[Callable[..., None]] = None,
    started: Optional[float] = None,
    spawn: "Optional[Spawn]" = None,
) -> "Generator[Chunk, None, Outcome]":
    """`run` on a terminal of its own (see the module): its output all "stdout", `stdin`
    typed into it. `on_start(proc, tty)` sees the process and its Tty once it runs."""
    tty = Tty(*size)

    def begun(proc: object) -> None:
        tty.drop_slave()
        if stdin is not None:
            fd = tty.writer()
            if fd is not None:
                in_thread(lambda: _feed(fd, stdin))
        if on_start is not None:
            on_start(proc, tty)

    try:
        return (
            yield from run(
                [sys.executable, "-I", "-c", CTTY, *argv],  # -I: nothing of the folder
                env,
                cwd,
                user,
                None,
                timeout,
                started=started,
                on_start=begun,
                out=tty.master,
                stdio=(tty.slave, tty.slave),
                spawn=spawn,
            )
        )
    finally:
        tty.close()
