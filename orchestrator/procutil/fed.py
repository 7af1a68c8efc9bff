"""The stdin pipes this process is feeding, and why no fork may keep one open: a child
forked while a command is being fed would hold its input's write end, and the command
would never see the end of its input. Standard library only, Python 3.7+."""

from __future__ import annotations

import os
import threading
from typing import IO, Set

FED: Set[int] = set()
"""Write ends of the stdin pipes this process is feeding (see `pump`)."""
FED_GUARD = threading.RLock()
"""Held from recording such a descriptor to letting it go, and across every os.fork(). Held
only for calls that cannot wait; reentrant, as a garbage collection inside it may finish
another command (its generator's `finally`)."""


def let_go(fd: int) -> None:
    """Make `fd` /dev/null: the pipe it was goes (its reader sees the end), and the number
    stays taken; not inherited by what is exec'd. /dev/null is opened without waiting and
    must be the null device (root in a sandbox may have replaced it by a FIFO); else `fd`
    becomes the write end of a fresh pipe nobody reads; with no descriptor left, it is
    closed."""
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        null = -1
    if null >= 0:
        try:
            if os.fstat(null).st_rdev != os.makedev(1, 3):
                os.close(null)
                null = -1
        except OSError:
            os.close(null)
            null = -1
    if null < 0:
        try:
            reader, null = os.pipe()
            os.close(reader)
        except OSError:
            try:
                os.close(fd)
            except OSError:
                pass
            return
    try:
        os.dup2(null, fd, inheritable=False)
    except OSError:
        pass
    finally:
        os.close(null)


def _fork_child_drops_fed() -> None:
    """In a child forked while commands of its parent were being fed: its copies of their
    stdin's write ends are let go (`let_go`), so each command sees the end of its input when its
    parent is done, not when this child exits too. The numbers stay taken (the child's
    copies of the file objects close them again one day, and must not close something
    else then)."""
    for fd in FED:
        let_go(fd)
    FED.clear()
    FED_GUARD.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=FED_GUARD.acquire,
        after_in_parent=FED_GUARD.release,
        after_in_child=_fork_child_drops_fed,
    )


def feeding(pipe: IO[bytes]) -> None:
    with FED_GUARD:
        if not pipe.closed:
            FED.add(pipe.fileno())


def close_fed(pipe: IO[bytes]) -> None:
    """Close a stdin pipe being fed. Its buffer is flushed first (that may wait on the
    command). Then, under the guard and without waiting, its descriptor is let go (see
    `let_go`) and forgotten: the command sees the end of its input, and no fork sees a number we
    freed. The file object is closed after that, outside the guard: what a buffer took
    since the flush (only from a caller abandoning the command) is dropped."""
    try:
        pipe.flush()
    except (OSError, ValueError):
        pass
    with FED_GUARD:
        try:
            fd = pipe.fileno()
        except (OSError, ValueError):  # closed already
            fd = -1
        if fd in FED:
            FED.discard(fd)
            let_go(fd)
    try:
        pipe.close()
    except (OSError, ValueError):
        pass
