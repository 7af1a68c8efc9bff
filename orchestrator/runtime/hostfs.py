"""What a sandbox leaves in a host folder it wrote through a bind mount, made harmless once
the sandbox has ended: no setuid or setgid file (a root sandbox owns its files as uid 0 on
the host), no device node. The walk never follows a link."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("orchestrator.docker")
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def defuse(root: Path) -> list[str]:
    """Clear setuid/setgid bits and remove device nodes below `root`; returns what changed
    (relative names). What this process may not change is logged, not raised: the caller is
    tearing down."""
    changed: list[str] = []
    for folder, dirs, names, dfd in os.fwalk(root, follow_symlinks=False):
        for name in (*dirs, *names):
            where = os.path.relpath(os.path.join(folder, name), root)
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode):
                    os.unlink(name, dir_fd=dfd)
                    changed.append(where)
                elif stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    fd = os.open(name, _OPEN, dir_fd=dfd)
                    try:
                        os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                    finally:
                        os.close(fd)
                    changed.append(where)
            except OSError as exc:
                log.warning("cannot defuse %s in %s: %s", where, root, exc.strerror)
    return changed
