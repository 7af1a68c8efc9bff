"""What a sandbox leaves in a host folder it wrote through a bind mount, made harmless once
the sandbox has ended: no setuid or setgid file (a root sandbox owns its files as uid 0 on
the host), no file capabilities (`security.capability`), no device node. The walk never
follows a link. This is the second line: while it runs, a sandbox that writes a host folder
other users can reach cannot make any of these there (docs/security.md)."""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

from orchestrator.errors import OutputLimitExceeded, SandboxPermissionError
from orchestrator.sandbox.unpack import parts_of

log = logging.getLogger("orchestrator.docker")
_NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN = os.O_RDONLY | os.O_NONBLOCK | _NO_LINK


FCAPS = "security.capability"


def defuse(root: Path) -> list[str]:
    """Clear setuid/setgid bits and file capabilities, and remove device nodes, below `root`;
    returns what changed (relative names). What this process may not change is logged, not
    raised: the caller is tearing down. `root` may be a single file (a file's own mount)."""
    changed: list[str] = []
    try:
        top = os.stat(root, follow_symlinks=False)
    except OSError:
        return changed
    if stat.S_ISREG(top.st_mode):
        parent = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if _defuse_file(root.name, parent, top, str(root.parent)):
                changed.append(root.name)
        except OSError as exc:
            log.warning("cannot defuse %s: %s", root, exc.strerror)
        finally:
            os.close(parent)
        return changed
    for folder, dirs, names, dfd in os.fwalk(root, follow_symlinks=False):
        for name in (*dirs, *names):
            where = os.path.relpath(os.path.join(folder, name), root)
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode):
                    os.unlink(name, dir_fd=dfd)
                    changed.append(where)
                elif stat.S_ISREG(st.st_mode) and _defuse_file(name, dfd, st, folder):
                    changed.append(where)
            except OSError as exc:
                log.warning("cannot defuse %s in %s: %s", where, root, exc.strerror)
    return changed


def _defuse_file(name: str, dfd: int, st: os.stat_result, folder: str) -> bool:
    """Clear one regular file's set-id bits and capabilities, through a descriptor opened
    without following a link; whether anything was there to clear."""
    setid = st.st_mode & (stat.S_ISUID | stat.S_ISGID)
    try:  # (a look by path: what is cleared is cleared through the descriptor below)
        caps = FCAPS in os.listxattr(os.path.join(folder, name), follow_symlinks=False)
    except OSError:
        caps = False
    if not setid and not caps:
        return False
    fd = os.open(name, _OPEN, dir_fd=dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        if setid:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
        if caps:
            try:
                os.removexattr(fd, FCAPS)
            except OSError as exc:
                if exc.errno != errno.ENODATA:  # (gone meanwhile: nothing to clear)
                    raise
    finally:
        os.close(fd)
    return True


def read_inside(root: Path, name: str, limit: int = 64 * 1024 * 1024) -> bytes:
    """The content of file `name` below `root`, for a host-side reader of a sandbox's
    workspace (a grader): every component is opened with O_NOFOLLOW from `root`, so a link
    anywhere on the way (`answer.txt` -> /etc/shadow), a FIFO or a device is refused
    (SandboxPermissionError) instead of followed; past `limit` bytes, OutputLimitExceeded."""
    parts = parts_of(name)
    if not parts:
        raise SandboxPermissionError(f"{name!r}: not a file below {root}")
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        for part in parts[:-1]:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NO_LINK, dir_fd=fds[-1]))
        fds.append(os.open(parts[-1], _OPEN, dir_fd=fds[-1]))
        st = os.fstat(fds[-1])
        if not stat.S_ISREG(st.st_mode):
            raise SandboxPermissionError(f"{name!r} in {root} is not a regular file: not read")
        if st.st_size > limit:
            raise OutputLimitExceeded(f"{name!r} in {root} is {st.st_size} bytes, over {limit}")
        with os.fdopen(os.dup(fds[-1]), "rb") as f:
            return f.read(limit + 1)[:limit]
    except OSError as exc:
        if isinstance(exc, OutputLimitExceeded):
            raise
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise SandboxPermissionError(
                f"{name!r} in {root} passes through a link: refused"
            ) from None
        raise
    finally:
        for fd in fds:
            os.close(fd)
