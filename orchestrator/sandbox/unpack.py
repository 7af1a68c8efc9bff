"""Unpacking an archive that came out of a sandbox, whose content is hostile by assumption.

tarfile's `data` filter is not enough on its own: it judges where an entry lands with
`os.path.realpath`, which some Python releases get wrong past PATH_MAX (CVE-2025-4517), and
the extraction itself then follows whatever links the archive made. Here nothing is judged by
resolving a path; it is made impossible to write outside the folder:

- every entry is reached from a file descriptor of the folder, one component at a time, each
  opened with O_NOFOLLOW|O_DIRECTORY (a link or a file where a folder should be refuses the
  archive), and files are created with O_CREAT|O_EXCL|O_NOFOLLOW;
- a link may only point down, or up by no more levels than it stands below the folder, with
  nothing but names after its leading `..`: resolved in any order, through any other links
  of the archive, it stays inside (each link it meets keeps the same rule);
- no device, FIFO or socket; no setuid, setgid or sticky bit, no write bit for group or
  others; owners are never set (the files belong to whoever unpacks).

What breaks a rule refuses the whole archive (SandboxUnsafeArchive); the caller unpacks into
a private folder and drops it then."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from typing import IO

from orchestrator.errors import SandboxUnsafeArchive

NAME_MAX, PATH_MAX, MAX_DEPTH = 255, 4095, 256
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CACHED = 64
"""Folders kept open between entries (an archive lists a folder's files together)."""


def parts_of(name: str) -> tuple[str, ...]:
    """An entry's name as path components below the folder; refused when it is absolute,
    climbs (`..`), is empty or too long for the file system."""
    if name.startswith("/"):
        raise SandboxUnsafeArchive(f"refused the archive: {name!r} is an absolute name")
    if len(name.encode(errors="surrogateescape")) > PATH_MAX:
        raise SandboxUnsafeArchive(f"refused the archive: a name is over {PATH_MAX} bytes")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if len(parts) > MAX_DEPTH:
        raise SandboxUnsafeArchive(f"refused the archive: a name is over {MAX_DEPTH} folders deep")
    for part in parts:
        if part == "..":
            raise SandboxUnsafeArchive(f"refused the archive: {name!r} climbs out with '..'")
        if len(part.encode(errors="surrogateescape")) > NAME_MAX:
            raise SandboxUnsafeArchive(f"refused the archive: a name in {name!r} is too long")
    return parts


def check_link(target: str, depth: int, name: str) -> None:
    """Refuse a symbolic link that could lead out of the folder: absolute, climbing more
    levels than `depth` (how far below the folder it stands), or climbing after a name
    (`a/../..` climbs from wherever `a` leads, which need not be where it stands)."""
    if not target or target.startswith("/"):
        raise SandboxUnsafeArchive(f"refused the archive: link {name!r} -> {target!r} leads out")
    climbs, named = 0, False
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part != "..":
            named = True
        elif named or climbs == depth:
            raise SandboxUnsafeArchive(
                f"refused the archive: link {name!r} -> {target!r} may lead out of the folder"
            )
        else:
            climbs += 1


def file_mode(mode: int) -> int:
    """A file's mode as unpacked: no setuid/setgid/sticky, no write for group or others,
    executable by all only if by its owner, always readable and writable by its owner."""
    mode &= 0o755
    if not mode & 0o100:
        mode &= ~0o111
    return mode | 0o600


def folder_mode(mode: int) -> int:
    """A folder's mode as unpacked: as for files, and always open to its owner (so a later
    download can merge into it and a discarded one can be removed)."""
    return (mode & 0o755) | 0o700


class Unpacker:
    """Entries written below the folder open as `root` (a descriptor), never through a
    link. Use as a context manager: leaving it sets the folders' modes and times."""

    def __init__(self, root: str | os.PathLike[str], *, copy_size: int = 1 << 20) -> None:
        self._root = os.open(root, _DIR)
        self._open: dict[tuple[str, ...], int] = {}
        self._folders: dict[tuple[str, ...], tuple[int, float]] = {}
        self._copy_size = copy_size

    def __enter__(self) -> Unpacker:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self._finish_folders()
        finally:
            self._forget()
            os.close(self._root)

    # ----- folders ------------------------------------------------------------------------
    def _forget(self) -> None:
        for fd in self._open.values():
            os.close(fd)
        self._open.clear()

    def _folder(self, parts: tuple[str, ...], *, create: bool = True) -> int:
        """A descriptor of the folder `parts` below the root, made as needed; a link or a
        file on the way refuses the archive."""
        at, fd = len(parts), self._root
        while at > 0 and (cached := self._open.get(parts[:at])) is None:
            at -= 1
        if at > 0:
            fd = cached  # type: ignore[assignment]
        for depth in range(at + 1, len(parts) + 1):
            fd = self._step(fd, parts[:depth], create)
        return fd

    def _step(self, parent: int, parts: tuple[str, ...], create: bool) -> int:
        name = parts[-1]
        try:
            fd = os.open(name, _DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(name, 0o700, dir_fd=parent)
            fd = os.open(name, _DIR, dir_fd=parent)
        except OSError as exc:
            if isinstance(exc, NotADirectoryError) or exc.errno == errno.ELOOP:  # a link
                where = "/".join(parts)
                raise SandboxUnsafeArchive(
                    f"refused the archive: {where!r} is a link or a file, and an entry "
                    "goes inside it"
                ) from exc
            raise
        if len(self._open) >= _CACHED:
            self._forget()
        self._open[parts] = fd
        return fd

    def _clear(self, parent: int, name: str) -> bool:
        """Remove what stands at `name` (a repeated entry), without following it. True when
        a folder went: the folders kept open are forgotten then (`parent` among them)."""
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)
            return False
        shutil.rmtree(name, dir_fd=parent)
        self._forget()  # some were below it
        return True

    # ----- entries ------------------------------------------------------------------------
    def add(self, member: tarfile.TarInfo, data: IO[bytes] | None) -> str:
        """Write one entry; returns its name below the folder ("" for the folder itself)."""
        parts = parts_of(member.name)
        if member.isdir():
            self._folder(parts)
            if parts:
                self._folders[parts] = (folder_mode(member.mode), member.mtime)
            return "/".join(parts)
        if not parts:
            raise SandboxUnsafeArchive("refused the archive: an entry with no name")
        parent = self._folder(parts[:-1])
        name = parts[-1]
        if self._clear(parent, name):
            parent = self._folder(parts[:-1])
        if member.issym():
            check_link(member.linkname, len(parts) - 1, member.name)
            os.symlink(member.linkname, name, dir_fd=parent)
        elif member.islnk():
            source = parts_of(member.linkname)
            if not source:
                raise SandboxUnsafeArchive(f"refused the archive: {member.name!r} links nothing")
            at = self._folder(source[:-1], create=False)
            if stat.S_ISLNK(os.stat(source[-1], dir_fd=at, follow_symlinks=False).st_mode):
                # the same link again, maybe shallower: its target must hold from here too
                check_link(os.readlink(source[-1], dir_fd=at), len(parts) - 1, member.name)
            os.link(source[-1], name, src_dir_fd=at, dst_dir_fd=parent, follow_symlinks=False)
        elif member.isreg():
            assert data is not None
            self._write(parent, name, data, member)
        else:
            raise SandboxUnsafeArchive(
                f"refused the archive: {member.name!r} is a device, FIFO or other special file"
            )
        with contextlib.suppress(OSError):  # a link's own time: not every file system
            os.utime(name, (member.mtime, member.mtime), dir_fd=parent, follow_symlinks=False)
        return "/".join(parts)

    def _write(self, parent: int, name: str, data: IO[bytes], member: tarfile.TarInfo) -> None:
        fd = os.open(name, _NEW_FILE, 0o600, dir_fd=parent)
        try:
            while chunk := data.read(self._copy_size):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fchmod(fd, file_mode(member.mode))
        finally:
            os.close(fd)

    def _finish_folders(self) -> None:
        """Folders' modes and times, deepest first (setting a folder's time before its
        content is written would not keep)."""
        self._forget()
        for parts in sorted(self._folders, key=len, reverse=True):
            mode, mtime = self._folders[parts]
            try:
                fd = self._folder(parts, create=False)
            except (FileNotFoundError, SandboxUnsafeArchive):
                continue  # replaced by a later entry
            os.fchmod(fd, mode)
            os.utime(fd, (mtime, mtime))
        self._forget()


def unpack(tar: tarfile.TarFile, root: str | os.PathLike[str], copy_size: int) -> Iterator[str]:
    """Unpack every entry of `tar` (opened for reading, a stream is fine) below `root`,
    yielding each entry's name as written."""
    with Unpacker(root, copy_size=copy_size) as out:
        for member in tar:
            data = tar.extractfile(member) if member.isreg() else None
            yield out.add(member, data)
