"""What every part of the process core shares: its constants, how a command ended
(`Outcome`), the errors it raises, and the per-thread scope a caller abandons a command by.
Standard library only, Python 3.7+."""

from __future__ import annotations

import contextlib
import errno
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple, Optional, Tuple

if sys.version_info >= (3, 8):
    from typing import Protocol
else:  # pragma: no cover - Python 3.7 inside containers: only annotations name it
    Protocol = object

GRACE = 0.5
"""Seconds between SIGTERM and SIGKILL on timeout."""
DRAIN = 0.1
"""Seconds of pipe silence, after the main process exited, before we stop reading."""
DRAIN_MAX = 2.0
"""Longest we keep reading after the main process exited (a background writer)."""
CHUNK = 1 << 18
"""Largest read of a command's output: one frame of the executor. The pipes are grown to it
(Linux), so bulk output (a folder being packed) crosses in a few hundred frames per 100 MB,
not thousands; the executor's window of frames in flight bounds memory at 64 of them."""
F_SETPIPE_SZ = 1031  # fcntl's name for it arrived in Python 3.10; the number is Linux's

NO_PROCESS = (errno.EAGAIN, errno.ENOMEM)
"""fork() errors that mean no process can be started at all (pids or memory limit)."""
scope = threading.local()
"""Per thread: what its caller set with `abandon_when` (cleared between a worker's jobs)."""


class Flag(Protocol):
    """What abandon_when watches: a threading.Event, or anything with its `is_set`."""

    def is_set(self) -> bool: ...


def abandon_when(event: Optional[Flag]) -> None:
    """From now on, a command `pump`ed in this thread is killed (as when its caller closes
    it early) within about 0.05 s of `event` being set: the caller, in another thread, gave
    up on it (an asyncio task was cancelled). None: no such event."""
    scope.abandon = event


@contextlib.contextmanager
def kept_on() -> Iterator[None]:
    """A command run in the block runs to its end even when this thread's caller gave up
    on its own command (see abandon_when): the kill of what it left is such a command."""
    saved = getattr(scope, "abandon", None)
    scope.abandon = None
    try:
        yield
    finally:
        scope.abandon = saved


def abandoned() -> bool:
    """Whether the caller of this thread's command gave up on it (see abandon_when)."""
    event: Optional[Flag] = getattr(scope, "abandon", None)
    return event is not None and event.is_set()


class Outcome(NamedTuple):
    """How a command ended (its output travels separately)."""

    exit_code: int
    """128+N when it was killed by signal N."""
    timed_out: bool
    elapsed: float
    oom_killed: bool = False


if TYPE_CHECKING:
    from typing import Literal

    StreamKind = Literal["stdout", "stderr"]
    Chunk = Tuple[StreamKind, bytes]
    Killer = Callable[["subprocess.Popen[bytes]", int], None]
    Spawn = Callable[..., Any]


def exit_status(returncode: int) -> int:
    """Popen's -N for "killed by signal N" becomes the shell's 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class UnknownUser(LookupError):
    """The user (or group) of a request does not exist where the command would run."""


class Lost(Exception):
    """A command that may have started but whose process is lost to us (the executor's
    spawner for its user was killed before it named it): it answers as killed (137), with
    the message on stderr, and is never started again."""


class NoProcess(OSError):
    """No process can be started at all: the pids or memory limit is reached."""
