"""Pool membership of a project, kept in its folder so that `ps` and other processes see it:
a file holding "<pool id> <state>", changed only under an exclusive lock on that file, so a
pool handing an environment out and another process claiming it never both get it.

The lock is `fcntl.flock` on the state file itself, through the one descriptor that reads and
writes it, not filelock: filelock locks a file of its own (and removes it on release), so it
would add a second file per project and a second open, no less code, for a lock held for the
microseconds of a read and a write (and the `then` of `move`) between processes of one host."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from orchestrator.paths import lock_descriptor, open_for_lock

POOL_FILE = "pool"
READY = "ready"
"""Up, set up, waiting in its pool."""
IN_USE = "in-use"
"""Handed out by its pool's acquire()."""
CLAIMED = "claimed"
"""Taken by another process (`orchestrator up --pool`): the pool no longer owns it."""
REMOVING = "removing"
"""Being removed by its pool."""


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[int]:
    fd = open_for_lock(directory / POOL_FILE, os.O_RDWR | os.O_CREAT)
    with lock_descriptor(fd):  # its closing releases the lock
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd


def _read_fd(fd: int) -> tuple[str, str] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    parts = os.read(fd, 256).decode(errors="replace").split()
    return (parts[0], parts[1]) if len(parts) == 2 else None


def _write_fd(fd: int, pool: str, state: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{pool} {state}\n".encode(), 0)


def membership(directory: Path | None) -> tuple[str, str] | None:
    """(pool id, state) of a project folder, or None when it belongs to no pool."""
    if directory is None:
        return None
    try:
        text = (directory / POOL_FILE).read_text()
    except OSError:
        return None
    parts = text.split()
    return (parts[0], parts[1]) if len(parts) == 2 else None


def enter(directory: Path, pool: str, state: str = READY) -> None:
    """Mark a project a member of `pool` in `state`."""
    with _locked(directory) as fd:
        _write_fd(fd, pool, state)


def move(directory: Path, frm: str, to: str, then: Callable[[], None] | None = None) -> bool:
    """Change the state from `frm` to `to`, atomically, and call `then` still holding the
    lock; False (and no change) when the project is not in state `frm` (or in no pool)."""
    try:
        with _locked(directory) as fd:
            current = _read_fd(fd)
            if current is None or current[1] != frm:
                return False
            _write_fd(fd, current[0], to)
            if then is not None:
                then()
            return True
    except OSError:  # the folder is gone: removed by `down` or a reaper
        return False
