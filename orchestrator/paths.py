"""Where the library keeps its state on the host (a leaf: any layer may use it).

The folder follows the XDG rule through platformdirs' Unix rule (`platformdirs.unix.Unix`,
on every platform, so a Mac keeps the same ~/.local/state it had): it ignores a relative
$XDG_STATE_HOME as the XDG spec says, and finds the home folder in the password database when
$HOME is empty or relative, where the hand-written rule made the state folder relative to the
current folder (so `ps` in one folder missed what `up` in another started)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from orchestrator import settings
from orchestrator.errors import OrchestratorError

STATE_DIR_ENV = settings.STATE_DIR.name


def state_dir() -> Path:
    """Where project folders live: $ORCHESTRATOR_STATE_DIR (absolute, or from ~), else
    $XDG_STATE_HOME/orchestrator (~/.local/state/orchestrator)."""
    return settings.STATE_DIR.get()


def projects_dir() -> Path:
    """Where every environment's project folder is (records for `attach` included)."""
    return state_dir() / "projects"


# ----- what we write on the host ------------------------------------------------------------
# Everything the library writes on this host (the state folder and all in it, records,
# archives, locks, a rendering) is made private as it is created, whatever the umask: folders
# 0700 and files 0600, each made with that mode (os.mkdir, os.open), never widened and then
# narrowed. A folder it finds there already must be a real folder (not a link) of this user.
# The few files a container reads through a bind mount (the executor, a gateway's rules) are
# made readable by any user of the container, inside a project folder only we may enter.
FOLDER_MODE = 0o700
FILE_MODE = 0o600


def _refused(path: Path, why: str) -> OrchestratorError:
    return OrchestratorError(
        f"{path} is not a folder of this user that only it can change ({why}), as the "
        "orchestrator's state and records need: remove it (or give it to this user), or set "
        f"{STATE_DIR_ENV} to a folder of yours"
    )


def make_folders(path: Path, mode: int = FOLDER_MODE) -> Path:
    """`path` and any missing folder above it made with `mode` (default 0700), whatever the
    umask; folders there already are left as they are (a caller's choice of destination)."""
    missing = []
    at = path
    while not os.path.lexists(at) and at != at.parent:
        missing.append(at)
        at = at.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, mode)
            if mode & ~FOLDER_MODE:  # wider than private: as asked, whatever the umask
                os.chmod(folder, mode)
    return path


def private_folder(path: Path) -> Path:
    """`path` as a folder only this user can change: made (missing parents too) with mode
    0700, or, when it is there, checked: a real folder, not a link, owned by this user. One
    of ours that others may enter (an older release's 0755, a loose umask's) is narrowed to
    0700 first thing; anything else is refused (OrchestratorError naming it and the fix).
    Checked and narrowed through one descriptor opened without following a link."""
    make_folders(path)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        why = f"not usable: {exc.strerror}"
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            why = "a link" if os.path.islink(path) else "not a folder"
        raise _refused(path, why) from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise _refused(path, f"owned by uid {info.st_uid}, not by this user")
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, FOLDER_MODE)
    finally:
        os.close(fd)
    return path


def _check_holders(folder: Path) -> None:
    """Every folder above the state folder may be changed only by root or this user (or is
    sticky, as /tmp is, so nobody else may move what is ours in it): else someone else could
    put another folder in its place."""
    me = os.geteuid()
    at = Path(os.path.realpath(folder))
    while not os.path.lexists(at) and at != at.parent:  # (what is missing, we make: 0700)
        at = at.parent
    for holder in [at, *at.parents]:
        try:
            info = os.stat(holder)
        except OSError as exc:
            raise _refused(folder, f"{holder} is not usable: {exc.strerror}") from None
        sticky = bool(info.st_mode & stat.S_ISVTX)
        others = info.st_mode & 0o022  # (a group, even this user's own, may have others)
        if info.st_uid not in (0, me):
            raise _refused(folder, f"it is inside {holder}, owned by uid {info.st_uid}")
        if others and not sticky:
            raise _refused(folder, f"it is inside {holder}, which others may write")


def state_folder(*parts: str) -> Path:
    """The state folder (or the folder `parts` below it), made private as `private_folder`
    says, each level; the folders holding it must be changeable by no one but root and this
    user. Call it before writing anything there."""
    root = state_dir()
    _check_holders(root.parent)
    folder = private_folder(root)
    for part in parts:
        folder = private_folder(folder / part)
    return folder


def write_file(path: Path, data: bytes | str, mode: int = FILE_MODE) -> None:
    """Write `path` whole with `mode` (default 0600) whatever the umask: a new file beside
    it, made with that mode, renamed into place, so a link or another file found there is
    replaced, never written through, and no reader ever sees half of it."""
    raw = data.encode() if isinstance(data, str) else data
    temp = path.with_name(f".{path.name}.{os.urandom(6).hex()}")  # (secrets: 4 ms to load)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, mode)
    try:
        try:
            if mode & ~FILE_MODE:  # wider than private: as asked, whatever the umask
                os.fchmod(fd, mode)
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


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
        chunks, left = [], limit + 1
        while left > 0 and (got := os.read(fd, left)):  # (a /proc file: a page a read)
            chunks.append(got)
            left -= len(got)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def write_owner(path: Path) -> None:
    """Write `path` (0600) naming this process: "pid start host" (see `read_owner`)."""
    from orchestrator.procutil import process_start  # (not loaded by what only reads paths)

    pid = os.getpid()
    write_file(path, f"{pid} {process_start(pid)} {socket.gethostname()}\n")


def read_owner(path: Path) -> tuple[str, str, str] | None:
    """(pid, start, host) of the process a file `write_owner` wrote names; None when it is
    missing, not a regular file (read as `read_regular` reads), over 512 bytes, or not of
    that form."""
    data = read_regular(path, 512)
    if data is None or len(data) > 512:
        return None
    try:
        pid, start, host = data.decode().split()
    except (UnicodeDecodeError, ValueError):
        return None
    return pid, start, host


def open_regular(path: Path) -> int:
    """`path` opened for reading (non-blocking) when it is a regular file reached without
    following a link at its last component; -1 when it is anything else (see
    `read_regular`). OSError when it cannot be opened."""
    fd, checked = _open_regular(path, False)
    if fd >= 0 and checked is not None and not _same(os.fstat(fd), checked):
        os.close(fd)
        return -1
    return fd


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
            with _LOCK_FDS_GUARD:  # (a fork between the two would give the child the lock)
                _LOCK_FDS.discard(fd)
                os.close(fd)


@contextlib.contextmanager
def locked_file(path: Path, within: float, busy: str) -> Iterator[None]:
    """An exclusive flock on the file `path` (made owner-only, never through a link), waited
    for `within` seconds at most (past that, OrchestratorError(`busy`)), held for the block."""
    fd = open_for_lock(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC)
    with lock_descriptor(fd):
        deadline = time.monotonic() + within
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OrchestratorError(busy) from None
                time.sleep(0.05)
        yield
