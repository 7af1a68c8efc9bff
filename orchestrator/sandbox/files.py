"""Files in the sandbox, moved with two POSIX sh helpers run as the command user, so every
backend reads and writes with the same permissions and errors.

The helpers honour a file's mode whoever asks: a file nobody may read is not read, and one
nobody may write is not overwritten, also for root (whose CAP_DAC_OVERRIDE would otherwise
make a read-only mark meaningless to a harness that relies on it)."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

from orchestrator.errors import (
    OrchestratorError,
    OutputLimitExceeded,
    SandboxFileNotFound,
    SandboxIsADirectory,
    SandboxNotADirectory,
    SandboxPermissionError,
    SandboxUnavailable,
    SandboxUnsafeArchive,
    UsageError,
)
from orchestrator.procutil import F_SETPIPE_SZ
from orchestrator.sandbox import landing, threads, unpack
from orchestrator.sandbox.options import FILE_LIMIT_ENV
from orchestrator.sandbox.streams import ArchiveStream, Feeder

# Exit codes of the file helper scripts below.
_NOT_FOUND, _IS_DIR, _DENIED, _TOO_BIG, _NOT_REGULAR = 2, 21, 13, 27, 22
OPEN_WAIT = 5
"""Seconds the helpers give an open that can block (below) before they refuse the path as
not a regular file: opening a regular file takes microseconds, so only a FIFO put in its
place after it was looked at (or an exotic device) waits that long."""

# The helpers open what they act on once, and judge what they opened (/dev/fd/3), never
# the path again: a FIFO, device or socket is refused (exit 22), as is anything a sandbox
# renames into place between a look at the path and the open. A path that is no regular
# file when looked at is refused without being opened at all (at once). An open for
# reading and writing (`<>`) never waits on a FIFO; one for reading alone, or writing
# alone, does until the other end is opened, so it runs in a subshell raced against a
# `sleep`: the open ends first (and stops the sleep) or is killed, and the path refused,
# after OPEN_WAIT s. Reading never opens for writing: `<>` creates a missing file (through
# a link the sandbox planted, too), which a read must not do.
# `_watched(redirection, body, failed)`: `body` run with fd 3 opened by `redirection`
# of "$p" under that race; `failed`: what a refused open exits with.
# not there, or out of reach: the reason find gives (it never opens the path), which ends
# its message (the start holds the path, whose words may be anything)
_PROBE = (
    'e=$(find "$p" -maxdepth 0 2>&1 >/dev/null); '
    'case "${e##*: }" in *ermission*) exit 13 ;; esac; exit 2'
)


def _watched(redirection: str, body: str, failed: str) -> str:
    return (
        f"sleep {OPEN_WAIT} </dev/null >/dev/null 2>&1 & s=$!; "
        f'( {{ kill $s 2>/dev/null; {body} }} 3{redirection}"$p" || '
        f"{{ kill $s 2>/dev/null; {failed} }} ) & b=$!; "
        "if wait $s 2>/dev/null; then kill -9 $b; exit 22; fi; wait $b"
    )


# what was opened: a regular file that someone may read (or write: the mode is honoured
# whoever asks, root too) and at most the limit long (its size counted only past it), read
# through the descriptor
_READ_BODY = (
    "[ -f /dev/fd/3 ] || exit 22; "
    '[ -n "$(find -L /dev/fd/3 -maxdepth 0 -perm /444 2>/dev/null)" ] || exit 13; '
    'if [ -n "$(find -L /dev/fd/3 -maxdepth 0 -size +"$2"c 2>/dev/null)" ]; then '
    # its size from its inode (a sparse file is not read through: busybox's wc would)
    "n=$(stat -L -c %s /dev/fd/3 2>/dev/null || wc -c <&3); echo $((n + 0)); exit 27; fi; "
    "exec cat <&3;"
)
_WRITE_BODY = (
    "[ -f /dev/fd/3 ] || exit 22; "
    '[ -n "$(find -L /dev/fd/3 -maxdepth 0 -perm /222 2>/dev/null)" ] || exit 13; '
    "true >/dev/fd/3 || exit 13; exec cat >&3 <&5;"  # emptied through the descriptor
)
WRITE = (
    'p=$1; d=${p%/*}; [ -n "$d" ] || d=/; '
    '[ -d "$p" ] && exit 21; '
    # a write bit for someone (`find -perm`, not `ls`: gVisor refuses the statx `ls` makes)
    'if [ -e "$p" ] && [ -z "$(find "$p" -maxdepth 0 -perm /222 2>/dev/null)" ]; then exit 13; fi; '
    'if ! mkdir -p -- "$d" 2>/dev/null; then [ -e "$d" ] && [ ! -d "$d" ] && exit 2; exit 13; fi; '
    '[ -e "$p" ] && { [ -f "$p" ] || exit 22; }; exec 5<&0; '
    # read and write: never waits (a file the user may write but not read goes on below)
    f'{{ {_WRITE_BODY} }} 2>/dev/null 3<>"$p"; '
    + _watched(">>", _WRITE_BODY, '[ -d "$d" ] || exit 2; exit 13;')
)
READ = (
    'p=$1; [ -d "$p" ] && exit 21; '
    f'if [ ! -e "$p" ]; then {_PROBE}; fi; '
    '[ -f "$p" ] || exit 22; ' + _watched("<", _READ_BODY, '[ -e "$p" ] || exit 2; exit 13;')
)


def write_argv(path: str) -> list[str]:
    """Write stdin to `path`, creating parent folders."""
    return ["/bin/sh", "-c", WRITE, "sh", path]


def read_argv(path: str, limit: int) -> list[str]:
    """Print `path`, or its size and exit 27 when it is over `limit` bytes."""
    return ["/bin/sh", "-c", READ, "sh", path, str(limit)]


def raise_for(code: int, path: str, verb: str, stderr: str, limit: int = 0, size: str = "") -> None:
    """Turn a helper's exit code into the matching error (nothing for 0)."""
    if code == 0:
        return
    if code == _TOO_BIG:
        raise OutputLimitExceeded(
            f"{path} is {size} bytes, over the read limit of {limit} "
            f"(pass limit= or set {FILE_LIMIT_ENV})"
        )
    if code == _NOT_FOUND:
        raise SandboxFileNotFound(f"cannot {verb} {path}: no such file or directory")
    if code == _IS_DIR:
        raise SandboxIsADirectory(f"cannot {verb} {path}: is a directory")
    if code == _NOT_REGULAR:  # as the host's own reader of a workspace says it (hostfs)
        raise SandboxPermissionError(
            f"cannot {verb} {path}: not a regular file (a FIFO, device or socket is never "
            "read or written)"
        )
    if code in (_DENIED, 1):
        raise SandboxPermissionError(f"cannot {verb} {path}: permission denied")
    if code == CANNOT_START:  # the helper's own programs (sh, cat) exist: it could not run them
        raise SandboxUnavailable(
            f"cannot {verb} {path}: cannot start a process in the sandbox (its process or "
            f"memory limit is reached?) {stderr.strip()}".rstrip()
        )
    raise OrchestratorError(f"cannot {verb} {path}: helper exited {code}: {stderr.strip()}")


CANNOT_START = 126
"""A shell's (and `docker exec`'s) exit status for a program it found but could not run."""


# Folders move as one tar stream: packed on one side, unpacked on the other, as the command
# user (so the sandbox's own permissions apply), with `-o`: files belong to whoever unpacks.
UPLOAD = (
    'd=$1; [ -e "$d" ] && [ ! -d "$d" ] && exit 20; '
    'mkdir -p -- "$d" 2>/dev/null || exit 13; '
    'tar -x -o -f - -C "$d" || exit 13'
)
DOWNLOAD = (
    # not there, or out of reach (a folder on the way this user cannot enter): find says
    # which, and never opens the path (a FIFO put there meanwhile would wait for a writer)
    f's=$1; p=$1; if [ ! -e "$s" ]; then {_PROBE}; fi; '
    '[ -d "$s" ] || exit 20; [ -r "$s" ] && [ -x "$s" ] || exit 13; '
    'export TAR_OPTIONS=--blocking-factor=2048; tar -c -f - -C "$s" .; t=$?; '
    "[ $t = 2 ] && exit 13; exit $t"  # GNU tar's 2 (a file it could not open) is not "missing"
)
# (GNU tar then writes 1 MiB records instead of 10 KiB ones: fewer, fuller reads on our side;
# busybox's tar ignores the variable.)
_NOT_DIR = 20


# A reset: the folder emptied (whatever its modes), then an archive unpacked in it with the
# owners it records (run as root in a container, so those are the owners at packing time).
# The old content is first moved (renamed, never followed) into a new folder of its own
# inside, removed while tar unpacks beside it, and waited for: the folder holds the
# archive's entries alone once the command ends. Where that folder cannot be made (its name
# taken: the content chose it), or something did not move, it is removed first, as before.
REPLACE = (
    'd=$1; [ -d "$d" ] || exit 20; chmod -R u+rwX -- "$d" 2>/dev/null; '
    # a random name: one an archive could name (a guessable pid) would be unpacked into
    # the folder being removed behind it
    'n=$(od -An -N8 -tx1 /dev/urandom 2>/dev/null | tr -d " \\n"); '
    'o="$d/.orchestrator-old.$n"; r=; '
    'if [ ${#n} = 16 ] && mkdir -m 700 -- "$o" 2>/dev/null; then '
    'mv -f -- "$d"/* "$d"/.[!.]* "$d"/..?* "$o/" 2>/dev/null; '
    'rm -rf -- "$o" & r=$!; '
    'for e in "$d"/* "$d"/.[!.]* "$d"/..?*; do '
    '[ "$e" = "$o" ] || { [ ! -e "$e" ] && [ ! -L "$e" ]; } || { wait $r; r=; break; }; '
    "done; fi; "
    'if [ -z "$r" ]; then rm -rf -- "$d"/* "$d"/.[!.]* "$d"/..?* || exit 13; fi; '
    'tar -x -f - -C "$d"; t=$?; '
    'if [ -n "$r" ]; then wait $r || t=13; fi; '
    "[ $t = 0 ] || exit 13"
)


def replace_argv(dest: str) -> list[str]:
    """Empty the folder `dest`, then unpack a tar stream from stdin into it."""
    return ["/bin/sh", "-c", REPLACE, "sh", dest]


def upload_argv(dest: str) -> list[str]:
    """Unpack a tar stream from stdin into the folder `dest` (created if missing)."""
    return ["/bin/sh", "-c", UPLOAD, "sh", dest]


def download_argv(src: str) -> list[str]:
    """Pack the folder `src` as a tar stream on stdout."""
    return ["/bin/sh", "-c", DOWNLOAD, "sh", src]


def raise_for_folder(code: int, path: str, verb: str, stderr: str) -> None:
    if code == _NOT_DIR:
        raise SandboxNotADirectory(f"cannot {verb} {path}: not a directory")
    raise_for(code, path, verb, stderr)


def _entries(folder: Path) -> list[Path]:
    """Everything under a local folder, checked before any of it is sent: files, folders
    and links only."""
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder on this machine")
    found = sorted(folder.rglob("*"))
    for path in found:
        mode = path.lstat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            raise UsageError(f"{path} is neither a file, a folder nor a link: not sent")
    return found


STREAM_CHUNK = 1 << 20


class PackStream(ArchiveStream):
    """A local folder as a tar stream, packed while it is sent (by the host's tar, or where
    there is none a thread writing Python's tarfile into a pipe), so packing and sending
    overlap and the archive is never whole in memory. Modes and symlinks are kept as they
    are (a link is stored as a link, never followed). A failure while packing (a file
    vanished or unreadable) ends the stream early and is kept in `error`, for the caller to
    raise once the other side has given up on the truncated archive."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.entries = _entries(folder)
        self.error: OrchestratorError | None = None

    def _write(self, fd: int) -> None:
        try:
            with (
                os.fdopen(fd, "wb") as out,
                tarfile.open(
                    fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=STREAM_CHUNK
                ) as tar,
            ):
                for path in self.entries:
                    tar.add(path, arcname=path.relative_to(self.folder).as_posix(), recursive=False)
        except BrokenPipeError:
            pass  # the reader stopped: the sending side reports why
        except OSError as exc:
            self.error = UsageError(f"cannot pack {exc.filename or self.folder}: {exc.strerror}")

    def __iter__(self) -> Iterator[bytes]:
        tar = shutil.which("tar")  # C, in a process of its own
        if tar is not None:
            yield from self._by_tar(tar)
            return
        read_fd, write_fd = os.pipe()
        with contextlib.suppress(OSError):  # bigger reads where Linux allows it
            fcntl.fcntl(write_fd, F_SETPIPE_SZ, STREAM_CHUNK)
        writer = threading.Thread(target=self._write, args=(write_fd,), daemon=True)
        writer.start()
        try:
            with os.fdopen(read_fd, "rb", buffering=0) as pipe:
                while chunk := pipe.read(STREAM_CHUNK):
                    yield chunk
        finally:
            writer.join()

    def _by_tar(self, tar: str) -> Iterator[bytes]:
        complaints: list[str] = []
        yield from _tar_chunks(tar, self.folder, complaints)
        if complaints:
            self.failed(complaints[0])

    def failed(self, why: str) -> None:
        """Keep the first reason packing failed, for the caller to raise."""
        if self.error is None:
            self.error = UsageError(f"cannot pack {self.folder}: {why}")

    def pack_into(self, fd: int) -> TarInto | None:
        """Start the host's tar writing the archive into `fd` (a FIFO the sandbox reads),
        or None where this machine has no tar. `fd` should be a write-only end, so that tar
        gets EPIPE and ends once no reader is left (its owner died, the sandbox stopped)
        instead of waiting forever for room in the FIFO."""
        tar = shutil.which("tar")
        return None if tar is None else TarInto(self, tar, fd)


class TarInto(Feeder):
    """The host's tar packing a PackStream's folder into a file descriptor."""

    def __init__(self, stream: PackStream, tar: str, fd: int) -> None:
        self._stream = stream
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        self._proc = subprocess.Popen(_tar_argv(tar, stream.folder), stdout=fd, stderr=self._errors)

    def wait(self) -> None:
        self._proc.wait()

    def stop(self) -> None:
        """The reading side is done: a tar still waiting to write (the sandbox stopped
        reading) is killed; a failure of tar's own becomes the stream's error."""
        try:
            code = self._proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            code = 0
        if code != 0:
            self._stream.failed(_tar_said(self._errors, code))
        self._errors.close()


def _tar_argv(tar: str, folder: Path) -> list[str]:
    return [tar, "-c", "-f", "-", "-b", "2048", "-C", str(folder), "."]


def _tar_said(errors: IO[bytes], code: int) -> str:
    """Why tar failed: what it printed (into `errors`), or its exit status."""
    errors.seek(0)
    return errors.read().decode(errors="replace").strip() or f"tar exited with {code}"


def _tar_chunks(tar: str, folder: Path, complaints: list[str]) -> Iterator[bytes]:
    """`folder` packed by the host's tar (in C, in a process of its own, so packing overlaps
    whatever the caller does with the chunks). A failure of tar's own is appended to
    `complaints`; closing the iterator early stops tar."""
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            _tar_argv(tar, folder), stdout=subprocess.PIPE, stderr=errors, bufsize=0
        )
        assert proc.stdout is not None
        with contextlib.suppress(OSError):
            fcntl.fcntl(proc.stdout.fileno(), F_SETPIPE_SZ, STREAM_CHUNK)
        finished = False
        try:
            while chunk := proc.stdout.read(STREAM_CHUNK):
                yield chunk
            finished = True
        finally:
            proc.stdout.close()
            if not finished:  # the caller stopped reading: so does tar
                proc.kill()
            if proc.wait() != 0 and finished:
                complaints.append(_tar_said(errors, proc.returncode))


def pack_host(folder: Path, limit: int) -> bytes | None:
    """A folder of this machine packed by the host's tar, for a folder the sandbox sees
    through a bind mount (its workspace): no trip through the sandbox. None when the host
    cannot do it whole (no tar, or an entry it may not read): the sandbox packs it then.
    Past `limit` bytes raises OutputLimitExceeded."""
    tar = shutil.which("tar")
    if tar is None or not folder.is_dir():
        return None
    complaints: list[str] = []
    archive = bytearray()
    for chunk in _tar_chunks(tar, folder, complaints):
        archive += chunk
        if len(archive) > limit:
            raise OutputLimitExceeded(
                f"{folder} packs to more than the limit of {limit} bytes (pass limit= or set "
                f"{FILE_LIMIT_ENV})"
            )
    return None if complaints else bytes(archive)


class Staged:
    """An archive from the sandbox unpacked into a private folder inside the destination,
    as it arrived: `commit()` moves it into place, `discard()` removes it. Nothing reaches
    the destination itself unless every entry passed, and none would replace one of the
    caller's of another kind (a folder by a file, a file by a folder). Every step works
    below the destination's descriptor (landing.py), never by path."""

    def __init__(self, folder: Path, dest: int, staging: str, names: list[str]) -> None:
        self.folder, self.dest, self.staging, self.names = folder, dest, staging, names

    def commit(self) -> list[str]:
        try:
            threads.last_step()  # a caller that was cancelled gets nothing moved in
        except threads.Stopped:
            self.discard()
            raise
        try:
            with landing.opened(self.staging, self.dest) as staged:
                found = landing.clash(staged, self.dest)
                if found is not None:
                    raise SandboxUnsafeArchive(
                        f"refused the archive: {found!r} is a folder on one side and not on "
                        f"the other, and what is in {self.folder} is never replaced by another "
                        f"kind (nothing was written to {self.folder})"
                    )
                for name in sorted(os.listdir(staged)):
                    landing.merge(name, staged, self.dest)
            os.rmdir(self.staging, dir_fd=self.dest)
        except SandboxUnsafeArchive:
            self.discard()
            raise
        except OSError as exc:
            self.discard()
            raise OrchestratorError(f"cannot move the download into {self.folder}: {exc}") from exc
        finally:
            self._close()
        return self.names

    def discard(self) -> None:
        if self.dest >= 0:
            landing.remove_tree(self.staging, self.dest)
        self._close()

    def _close(self) -> None:
        if self.dest >= 0:
            os.close(self.dest)
            self.dest = -1


class _Incoming(io.RawIOBase):
    """The archive's chunks as the file tarfile reads, pulled as tarfile asks (no thread,
    no pipe: the sandbox's side runs ahead in its own process) and counted against the
    limit."""

    def __init__(self, chunks: Iterable[bytes], limit: int) -> None:
        super().__init__()
        self._chunks = iter(chunks)
        self._chunk, self._at = b"", 0
        self.limit, self.received = limit, 0

    def _pull(self) -> bool:
        for chunk in self._chunks:
            threads.check_stop()  # its caller was cancelled: the unpacking stops here
            self.received += len(chunk)
            if self.received > self.limit:
                raise OutputLimitExceeded(
                    f"the folder packs to more than the limit of {self.limit} bytes (pass "
                    f"limit= or set {FILE_LIMIT_ENV})"
                )
            if chunk:
                self._chunk, self._at = chunk, 0
                return True
        return False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._at >= len(self._chunk) and not self._pull():
            return b""
        chunk, at = self._chunk, self._at
        end = len(chunk) if size < 0 else min(len(chunk), at + size)
        self._at = end
        return chunk if at == 0 and end == len(chunk) else chunk[at:end]

    def drain(self) -> None:
        """Read what follows the archive's end (tar's padding), so the command can end."""
        while self._pull():
            pass


# tarfile copies what it has buffered on every read: small reads copy less (1 MiB reads
# cost more than the whole unpacking besides); file data is then copied in big blocks.
READ_SIZE, COPY_SIZE = 1 << 16, 1 << 20


def stage(
    chunks: Iterable[bytes], folder: Path, limit: int, guarded: Sequence[Path] = ()
) -> Staged:
    """Unpack a tar stream from the sandbox while it arrives, into a private folder inside
    `folder`, by `unpack` (nothing written through a link, nothing that could lead out:
    absolute names, `..`, links that could point out, devices and FIFOs refuse the archive;
    setuid bits are dropped). `folder` is reached as landing.py says (a link inside one of
    the `guarded` folders, those the sandbox writes, refuses it; what is missing is made
    0700). Refused, cut short or past `limit` bytes, the private folder goes and the error
    is raised. The caller commits; the names it gets are relative."""
    try:
        dest = landing.open_destination(folder, guarded)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(
            f"{folder} is not a folder on this machine: a download goes into one"
        ) from None
    except OSError as exc:
        raise OrchestratorError(f"cannot make the folder {folder}: {exc.strerror}") from None
    try:
        staging = landing.make_staging(dest)
    except OSError as exc:
        os.close(dest)
        raise OrchestratorError(f"cannot write in the folder {folder}: {exc.strerror}") from None
    staged = Staged(folder, dest, staging, [])
    incoming = _Incoming(chunks, limit)
    try:
        with tarfile.open(fileobj=incoming, mode="r|", bufsize=READ_SIZE) as tar:
            where = f"/proc/self/fd/{dest}/{staging}"
            staged.names.extend(n for n in unpack.unpack(tar, where, COPY_SIZE) if n)
        incoming.drain()
    except tarfile.TarError as exc:
        if incoming.received == 0:
            return staged  # nothing came: the sandbox's side says why
        staged.discard()
        raise OrchestratorError(f"cannot unpack into {folder}: {exc}") from exc
    except SandboxUnsafeArchive as exc:
        staged.discard()
        raise SandboxUnsafeArchive(f"{exc} (nothing was written to {folder})") from None
    except OrchestratorError:  # over the limit, or the sandbox's side failed
        staged.discard()
        raise
    except OSError as exc:  # an entry this machine cannot hold (a hard link to nothing, say)
        staged.discard()
        raise OrchestratorError(f"cannot unpack into {folder}: {exc}") from exc
    except BaseException:
        staged.discard()
        raise
    return staged
