"""Host folders and files given to a container, pinned: the engine mounts exactly what the
policy checked, whatever happens to the path afterwards.

The policy (spec/policy.py) resolves a host path and checks it; the engine mounts a path some
0.1 s later, following links. A sandbox that can write near the path (a read-write mount of
an earlier sample of the same file, a Compose `./:/work`) could swap it in between
(`renameat2(RENAME_EXCHANGE)` with a link to `/`), and the next sandbox would start with the
host's root. So the path is never handed over: `Pins.pin` reaches the checked path from `/`
one component at a time, following no link (a link that appeared since the check refuses the
start), checks what it found by its descriptor, and gives the engine that descriptor:

- a folder becomes a volume of the engine's `local` driver bound to `/proc/<pid>/fd/<n>`: the
  engine mounts the folder that descriptor holds (a magic link is no path: nothing can be
  swapped in it), the container mounts the volume; this process holds the descriptor until
  the project is up (`Pins.close`), the volume is removed with the project;
- a regular file becomes a private hard link to it (same inode, read and written through) in
  the project's owner-only folder, or, where no link can be made, a private copy (read-only
  mounts only: a read-write one must reach the file itself).

That needs the engine to resolve `/proc/<pid>/fd/<n>` in this process's namespaces (a volume
mount must come from its own mount namespace): an engine on this machine's socket whose
process this one sees, in the same mount namespace as far as it can tell (`engine_shares_ns`).
Elsewhere (rootless engines, an engine in a VM, this process in a container) paths are given
as they are only when the caller accepts the race (Policy.allow_unpinned_mounts).

`closed_to_others` answers the question gVisor needs answered for each folder it writes (see
seccomp.py): can any other user of this host reach it?"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import shutil
import socket
import stat
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("orchestrator.docker")

PINNED_DIR = "pinned"
"""In the project folder: the private links (or copies) of pinned files."""
PIN_VOLUME = "_PIN"
"""The key of a pinned folder's volume in a project is this and a number (`_PIN0`): a name no
file's own volume can take or end with (theirs are lower-case), so one is never taken for the
other (a suspend refuses a container's own volumes, not these: they are host folders)."""
SOURCE_LABEL = "org.orchestrator.source"
"""On a pinned folder's volume: the host path it was pinned at (for people; never read back
to decide anything)."""
_WALK = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def is_pinned_volume(name: str) -> bool:
    """Whether a volume (by its engine name, `<project>_<key>`) is a pinned host folder's."""
    return re.search(rf"_{PIN_VOLUME}\d+$", name) is not None


class PinRefused(Exception):
    """The path is not what was checked any more, or cannot be pinned; says which and why."""


@dataclass(frozen=True)
class Pinned:
    """What the engine mounts in place of a checked host path."""

    folder: bool
    device: str
    """A folder: the `/proc/<pid>/fd/<n>` its volume binds. A file: the private link or copy."""
    source: Path
    """The path that was checked (for messages and labels)."""


def open_exact(real: Path) -> int:
    """An O_PATH descriptor of `real` (absolute, already resolved), reached from `/` one
    component at a time with O_NOFOLLOW: if any component is a link now, or is gone,
    PinRefused. What it holds is what lies at exactly that path at this moment."""
    if not real.is_absolute() or ".." in real.parts:
        raise PinRefused(f"{real} is not an absolute resolved path")
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        parts = real.parts[1:]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = _WALK if last else _WALK | os.O_DIRECTORY
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise PinRefused(f"{real} changed after it was checked: a link now") from None
                raise PinRefused(f"{real}: {exc.strerror}") from None
            os.close(fd)
            fd = nxt
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise PinRefused(f"{real} changed after it was checked: a link now")
        return fd
    except BaseException:
        os.close(fd)
        raise


@dataclass
class Pins:
    """The descriptors of one project's pinned paths, held until the engine has mounted them
    (`close`). Pinning the same path twice gives one pin."""

    folder: Path
    """Where pinned files are linked or copied (inside the owner-only project folder)."""
    _fds: list[int] = field(default_factory=list)
    _done: dict[tuple[Path, bool], Pinned] = field(default_factory=dict)

    def pin(self, real: Path, *, writable: bool) -> Pinned:
        """Pin `real` (resolved and checked by the policy); PinRefused says why not."""
        key = (real, writable)
        if key in self._done:
            return self._done[key]
        fd = open_exact(real)
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                self._fds.append(fd)
                pinned = Pinned(True, f"/proc/{os.getpid()}/fd/{fd}", real)
            elif stat.S_ISREG(mode):
                try:
                    pinned = Pinned(False, str(self._file(fd, real, writable)), real)
                finally:
                    os.close(fd)
            else:
                os.close(fd)
                what = "a link now" if stat.S_ISLNK(mode) else "not a folder or a regular file"
                raise PinRefused(f"{real} changed after it was checked: {what}")
        except PinRefused:
            raise
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        self._done[key] = pinned
        return pinned

    def _file(self, fd: int, real: Path, writable: bool) -> Path:
        self.folder.mkdir(mode=0o700, exist_ok=True)
        dest = self.folder / f"{len(self._done)}-{real.name}"
        try:  # the very inode checked, found through its descriptor
            _link_descriptor(fd, dest)
            return dest
        except OSError as exc:
            if writable:
                raise PinRefused(
                    f"{real} cannot be linked into the state folder ({exc.strerror}): a "
                    "read-write mount of a single file must be on the state folder's "
                    "filesystem and yours; mount its folder instead"
                ) from None
        with os.fdopen(os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC), "rb") as src:
            if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                raise PinRefused(f"{real} is not a regular file now")
            fd_out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd_out, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        dest.chmod(0o444)  # a copy for reading: whoever the sandbox runs as may read it
        return dest

    @property
    def held(self) -> bool:
        """Whether it holds a folder's descriptor (a volume's device names it)."""
        return bool(self._fds)

    def close(self) -> None:
        """Let go of the descriptors (the engine holds its mounts of them now)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Pins:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000


def _link_descriptor(fd: int, dest: Path) -> None:
    """A hard link at `dest` to the file `fd` holds (not to whatever its path names now):
    `linkat(fd, "", AT_EMPTY_PATH)`, which os.link cannot ask for (allowed for the opener of
    the file since Linux 6.10, with CAP_DAC_READ_SEARCH before); else through the magic link
    /proc/self/fd/N, where the kernel allows that. OSError when neither can."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.linkat(fd, b"", _AT_FDCWD, os.fsencode(dest), _AT_EMPTY_PATH) == 0:
        return
    first = ctypes.get_errno()
    try:
        os.link(f"/proc/self/fd/{fd}", dest, follow_symlinks=True)
    except OSError:
        raise OSError(first, os.strerror(first)) from None


_PEERCRED = struct.Struct("3i")


def engine_shares_ns(sock_path: str | None) -> bool:
    """Whether the engine behind Unix socket `sock_path` resolves `/proc/<our pid>` to this
    process, in this process's mount namespace: its process is visible from here (the
    socket's peer has a pid in our pid namespace) and, where we may look, its pid and mount
    namespaces are ours. False for no socket (a remote engine), another platform, or an
    engine we cannot see (this process in a container, a rootless engine's namespaces)."""
    if not sock_path or not hasattr(socket, "SO_PEERCRED"):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2.0)
            s.connect(sock_path)
            raw = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return False
    pid = _PEERCRED.unpack(raw)[0]
    if pid <= 0:
        return False
    for ns in ("pid", "mnt"):
        try:
            if os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"):
                return False
        except PermissionError:
            continue  # another user's engine: its namespaces are not ours to read
        except OSError:
            return False
    return True


LINK_WALK = (100_000, 10.0)
"""Most entries, and seconds, `linked_elsewhere` looks at before it gives up."""


def linked_elsewhere(real: Path) -> str | None:
    """Why a sandbox writing `real` (a folder, or a file) could reach another path of this
    host than those below it: a regular file with more than one link (its other links may
    lie anywhere on that filesystem, where other users reach them; a set-user-ID bit set
    through this one shows there). None when there is no such file; a reason too when the
    folder is too large to look through."""
    limit, seconds = LINK_WALK
    deadline = time.monotonic() + seconds
    try:
        top = os.stat(real, follow_symlinks=False)
    except OSError as exc:
        return f"{real} cannot be looked at: {exc.strerror}"
    if stat.S_ISREG(top.st_mode):
        return f"{real} has {top.st_nlink} links" if top.st_nlink > 1 else None
    seen = 0
    for folder, _, names, dfd in os.fwalk(real, follow_symlinks=False):
        for name in names:
            seen += 1
            if seen > limit or time.monotonic() > deadline:
                return f"{real} holds more than can be looked through ({limit} entries)"
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                return f"{os.path.join(folder, name)} has {st.st_nlink} links"
    return None


def closed_to_others(real: Path) -> Path | None:
    """A folder above `real` (not `real` itself: a root sandbox can chmod the folder it
    writes) that no other user of this host can pass through: owned by this user or root,
    with no search permission for group or others and no access ACL. None when there is no
    such folder, so others may reach what a sandbox leaves in `real`."""
    me = os.geteuid()
    for parent in real.parents:
        try:
            st = os.stat(parent, follow_symlinks=False)
        except OSError:
            return None
        if st.st_uid not in (me, 0) or st.st_mode & 0o011:
            continue
        try:
            if "system.posix_acl_access" in os.listxattr(parent, follow_symlinks=False):
                continue
        except OSError:
            pass  # a filesystem without extended attributes has no ACL either
        return parent
    return None
