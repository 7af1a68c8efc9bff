"""Where the library keeps its state on the host (a leaf: any layer may use it).

The folder follows the XDG rule through platformdirs' Unix rule (`platformdirs.unix.Unix`,
on every platform, so a Mac keeps the same ~/.local/state it had): it ignores a relative
$XDG_STATE_HOME as the XDG spec says, and finds the home folder in the password database when
$HOME is empty or relative, where the hand-written rule made the state folder relative to the
current folder (so `ps` in one folder missed what `up` in another started)."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from orchestrator.errors import UsageError

STATE_DIR_ENV = "ORCHESTRATOR_STATE_DIR"


def state_dir() -> Path:
    """Where project folders live: $ORCHESTRATOR_STATE_DIR (absolute, or from ~), else
    $XDG_STATE_HOME/orchestrator (~/.local/state/orchestrator)."""
    explicit = os.environ.get(STATE_DIR_ENV, "").strip()
    if explicit:
        path = Path(os.path.expanduser(explicit))  # an unknown ~user stays, and is refused
        if not path.is_absolute():
            raise UsageError(
                f"{STATE_DIR_ENV} must be an absolute path (or start with ~), got {explicit!r}"
            )
        return path
    from platformdirs.unix import Unix  # loaded only by a lookup without ORCHESTRATOR_STATE_DIR

    return Path(Unix("orchestrator").user_state_dir)


def projects_dir() -> Path:
    """Where every environment's project folder is (records for `attach` included)."""
    return state_dir() / "projects"


def read_regular(path: Path, limit: int, *, follow: bool = False) -> bytes | None:
    """At most `limit` + 1 bytes of a regular file (a caller tells one past `limit` by the
    length), never through a link unless `follow`; None when it is missing, not a regular
    file, or cannot be read. Anything else is never opened for reading: a FIFO would make
    us wait, and a device's driver acts on an open (the path may come from a label anyone
    on the engine sets, into a sandbox's filesystem). On Linux the file is found without
    being opened (O_PATH), checked, then opened through that very handle."""
    try:
        fd, checked = _open_regular(path, follow)
    except OSError:
        return None
    if fd < 0:
        return None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or (checked is not None and not _same(found, checked)):
            return None
        return os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def _open_regular(path: Path, follow: bool) -> tuple[int, os.stat_result | None]:
    """`path` opened for reading when it is a regular file (-1 when it is not), and what
    was checked before opening it (None: nothing to compare, the handle was the check)."""
    nofollow = 0 if follow else os.O_NOFOLLOW
    read = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    o_path = getattr(os, "O_PATH", 0)
    if o_path:
        handle = os.open(path, o_path | os.O_CLOEXEC | nofollow)
        try:
            if not stat.S_ISREG(os.fstat(handle).st_mode):
                return -1, None
            try:
                return os.open(f"/proc/self/fd/{handle}", read), None
            except FileNotFoundError:  # no /proc here: checked, then compared (below)
                pass
        finally:
            os.close(handle)
    seen = os.stat(path, follow_symlinks=follow)
    if not stat.S_ISREG(seen.st_mode):
        return -1, None
    return os.open(path, read | nofollow), seen


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


_LOCK_FDS: set[int] = set()
"""Descriptors this process holds a lock through (see `lock_descriptor`)."""
_LOCK_FDS_GUARD = threading.Lock()
"""Held from opening such a descriptor to recording it, and across every os.fork(): a child
never gets one that is not in _LOCK_FDS."""


def _close_lock_fds() -> None:
    for fd in _LOCK_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _LOCK_FDS.clear()
    _LOCK_FDS_GUARD.release()


os.register_at_fork(
    before=_LOCK_FDS_GUARD.acquire,
    after_in_parent=_LOCK_FDS_GUARD.release,
    after_in_child=_close_lock_fds,
)


def open_for_lock(path: Path, flags: int, mode: int = 0o600) -> int:
    """`path` opened (os.open) to flock through: leave it to `lock_descriptor`, at once."""
    with _LOCK_FDS_GUARD:
        fd = os.open(path, flags, mode)
        _LOCK_FDS.add(fd)
    return fd


@contextlib.contextmanager
def lock_descriptor(fd: int) -> Iterator[int]:
    """`fd` (from `open_for_lock`), closed on leaving. A flock belongs to the open file, so a
    child forked while some thread holds it would keep it for as long as it lives (every
    other spawn of this user waiting on it): the child's copy is closed at fork, and a child
    forked inside the block leaves whatever has that number there now alone."""
    pid = os.getpid()
    try:
        yield fd
    finally:
        if os.getpid() == pid:
            _LOCK_FDS.discard(fd)
            os.close(fd)
