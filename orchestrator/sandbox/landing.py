"""Where a download lands: the caller's destination folder, held open, and the moves that
put a staged archive there, all by folder descriptors.

A destination may lie in a folder the sandbox writes (its workspace, a read-write mount):
there a sandbox can plant a link (`collected -> /root/.ssh`) for the caller's next download
to write through, or swap a folder for one between a check and a move. So the destination
is reached one component at a time: links are followed as the caller's path says them only
outside the folders the sandbox writes (`guarded`); inside one, a link refuses the download.
What is missing is made 0700 (never with the caller's umask). The staging folder, the clash
check and the merge then work below descriptors, never by path, with O_NOFOLLOW at every
step: nothing is written outside the destination's tree, whatever the sandbox does to it
meanwhile."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path

from orchestrator.errors import SandboxUnsafeArchive, UsageError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NO_LINK = _DIR | os.O_NOFOLLOW
MAX_LINKS = 40
"""Links followed on the way to a destination before it is refused (as the kernel's ELOOP)."""


class Refused(UsageError):
    """The destination cannot be reached without following a link a sandbox may have put."""


def open_destination(folder: Path, guarded: Sequence[Path] = ()) -> int:
    """A descriptor of the folder `folder` (made, 0700, where missing): the caller's path,
    links in it followed outside `guarded` (the host folders the sandbox writes, resolved)
    and refused inside them."""
    roots = [Path(os.path.realpath(r)) for r in guarded]
    target = Path(os.path.abspath(folder))
    fd = os.open("/", _DIR)
    try:
        return _walk(fd, Path("/"), list(target.parts[1:]), roots, folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def _walk(fd: int, real: Path, parts: list[str], roots: list[Path], asked: Path) -> int:
    """Go down `parts` from `fd` (the folder at `real`); returns the last folder's descriptor
    (`fd` is consumed)."""
    links = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        inside = any(real == r or real.is_relative_to(r) for r in roots)
        if part == "..":
            if inside:
                raise Refused(f"{asked}: `..` inside a folder the sandbox writes")
            real = real.parent
            nxt = os.open(real, _DIR)
        else:
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                os.mkdir(part, 0o700, dir_fd=fd)
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if inside:
                    raise Refused(
                        f"{asked}: {real / part} is a link inside a folder the sandbox writes "
                        "(it may have put it there): a download never goes through it"
                    )
                links += 1
                if links > MAX_LINKS:
                    raise Refused(f"{asked}: too many links on the way")
                target = os.readlink(part, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd, real = os.open("/", _DIR), Path("/")
                parts[:0] = (
                    Path(target).parts[1:]
                    if target.startswith("/")
                    else [p for p in target.split("/")]
                )
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise UsageError(
                    f"{asked} is not a folder on this machine: a download goes into one"
                )
            nxt = os.open(part, _NO_LINK, dir_fd=fd)
            real = real / part
        os.close(fd)
        fd = nxt
    return fd


def make_staging(dest: int) -> str:
    """A new private folder (0700) in the destination, for an archive to land in first."""
    name = f".orchestrator-download-{secrets.token_hex(8)}"
    os.mkdir(name, 0o700, dir_fd=dest)
    return name


def _kind(name: str, dfd: int) -> str | None:
    """ "dir", "link", "other", or None when missing: what `name` is in `dfd`, unfollowed."""
    try:
        mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(mode):
        return "dir"
    return "link" if stat.S_ISLNK(mode) else "other"


def clash(src: int, dst: int, where: str = "") -> str | None:
    """The first name below `src` whose entry is a folder where `dst` holds something else
    that is not a link, or the other way round (merging would delete what the caller has
    there); None when there is none."""
    for name in sorted(os.listdir(src)):
        there = _kind(name, dst)
        if there in (None, "link"):
            continue  # new, or a link in the way (replaced, never followed)
        mine = _kind(name, src)
        if (mine == "dir") != (there == "dir"):
            return f"{where}{name}"
        if mine == "dir":
            with opened(name, src) as s, opened(name, dst) as d:
                found = clash(s, d, f"{where}{name}/")
            if found is not None:
                return found
    return None


def merge(name: str, src: int, dst: int) -> None:
    """Move `name` from `src` into `dst`: folders merge into existing folders, a file
    replaces a file or a link (never followed), a folder replaces a link. A folder of the
    caller's is never replaced by another kind."""
    there = _kind(name, dst)
    mine = _kind(name, src)
    if there == "dir":
        if mine != "dir":
            raise SandboxUnsafeArchive(f"refused to replace the folder {name} by a file")
        with opened(name, src) as s, opened(name, dst) as d:
            for child in sorted(os.listdir(s)):
                merge(child, s, d)
        os.rmdir(name, dir_fd=src)  # (the caller's folder keeps its own mode: never widened)
        return
    if there == "link" and mine == "dir":
        os.unlink(name, dir_fd=dst)  # a link in the way is replaced, never followed
    os.replace(name, name, src_dir_fd=src, dst_dir_fd=dst)


class opened:
    """A folder below `parent`, opened without following a link (closed on leaving)."""

    def __init__(self, name: str, parent: int) -> None:
        self.fd = os.open(name, _NO_LINK, dir_fd=parent)

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *_: object) -> None:
        os.close(self.fd)


def remove_tree(name: str, parent: int) -> None:
    """Remove the folder `name` below `parent` and all in it, never following a link."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        with opened(name, parent) as fd:
            for child in os.listdir(fd):
                if _kind(child, fd) == "dir":
                    remove_tree(child, fd)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(child, dir_fd=fd)
        os.rmdir(name, dir_fd=parent)
