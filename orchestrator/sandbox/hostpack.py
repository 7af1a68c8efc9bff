"""Folders of this machine as tar archives. A local folder as a stream (`PackStream`, what
`upload` sends), packed while it is sent. Archives written into files (a snapshot's, a
suspend record's), never whole in memory: a private part file beside where the archive
goes, moved into place by the caller (`into_part`). A folder of this machine that a sandbox
sees through a bind mount (its workspace) is packed by the host's tar straight into one
(`pack_to_file`; `pack_host` into memory, for a pool's baseline): tar writes into a pipe, which
the kernel moves into the file (splice), so the archive never passes through this process's
memory, and is counted as it goes: past the limit, tar is stopped and the file removed.
Packing only reads the folder and never follows a link in it (tar stores links as links,
FIFOs and devices as entries, never reading them), so its content being hostile does no
harm here; what it holds is judged when it is unpacked (sandbox/unpack.py)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import shutil
import stat
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from orchestrator.errors import (
    OrchestratorError,
    OutputLimitExceeded,
    SandboxFileTimeout,
    UsageError,
)
from orchestrator.procutil import F_SETPIPE_SZ, alive, process_start
from orchestrator.sandbox import threads
from orchestrator.sandbox.files import STREAM_CHUNK
from orchestrator.sandbox.options import FILE_LIMIT_ENV
from orchestrator.sandbox.streams import ArchiveStream, Feeder

CHUNK = 1 << 20
PART = ".part"
"""Suffix of an archive being written (beside where it goes, moved there once whole)."""


def new_part(folder: Path) -> tuple[int, Path]:
    """A new, private (0600) file in `folder` for an archive being written, named after
    this process (pid and start time), so that one a killed writer left is known for what
    it is (`sweep_parts`). Those of dead writers in `folder` go first."""
    sweep_parts(folder)
    pid = os.getpid()
    prefix = f".snapshot-{pid}-{process_start(pid)}-"
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=PART, dir=folder)
    return fd, Path(name)


def sweep_parts(folder: Path) -> list[str]:
    """Remove the archives being written in `folder` whose writer is gone (a process killed
    while it packed: nobody else would ever remove them, each up to the snapshot limit);
    returns their names. Only files named as new_part names them, never followed."""
    gone = []
    with contextlib.suppress(OSError):
        for part in folder.glob(f".snapshot-*{PART}"):
            pid, _, rest = part.name.removeprefix(".snapshot-").partition("-")
            start = rest.partition("-")[0]
            if not (pid.isdigit() and start.isdigit()) or alive(int(pid), start):
                continue
            with contextlib.suppress(OSError):
                if stat.S_ISREG(part.lstat().st_mode):
                    part.unlink()
                    gone.append(part.name)
    return gone


def into_part(folder: Path, fill: Callable[[int], object]) -> Path:
    """A new part file in `folder` (see new_part), written by `fill(fd)`: returned once
    `fill` returns (the caller moves it into place, or removes it), removed if it raises."""
    fd, path = new_part(folder)
    try:
        fill(fd)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return path


def write_all(fd: int, data: bytes) -> None:
    """All of `data` into the file `fd`."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def pack_to_file(folder: Path, into: Path, limit: int, timeout: float | None = None) -> Path | None:
    """`folder` packed by the host's tar into a new file in the folder `into` (returned: the
    caller moves it into place, or removes it). Past `limit` bytes, OutputLimitExceeded (the
    file, which never held more than one byte over, is gone); past `timeout` seconds,
    SandboxFileTimeout (tar is killed). None, with nothing left behind, where the host
    cannot pack it whole (no tar, or an entry it may not read): the sandbox packs it then."""
    tar = shutil.which("tar")
    if tar is None or not folder.is_dir():
        return None
    fd, path = new_part(into)
    keep = False
    try:
        with tempfile.TemporaryFile() as errors:
            proc = subprocess.Popen(
                tar_argv(tar, folder), stdout=subprocess.PIPE, stderr=errors, bufsize=0
            )
            assert proc.stdout is not None
            try:
                with contextlib.suppress(OSError):  # bigger moves where Linux allows it
                    fcntl.fcntl(proc.stdout.fileno(), F_SETPIPE_SZ, CHUNK)
                _move(proc.stdout.fileno(), fd, limit, folder, timeout)
            finally:
                proc.stdout.close()
                if proc.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=0.5)  # tar ends once all it wrote is read
                    proc.kill()  # stopped early (over the limit, late): tar stops too
                proc.wait()
        keep = proc.returncode == 0
        return path if keep else None
    except OrchestratorError:
        raise
    except OSError as exc:
        raise OrchestratorError(f"cannot write the archive of {folder} in {into}: {exc}") from exc
    finally:
        os.close(fd)
        if not keep:
            path.unlink(missing_ok=True)


def _move(src: int, dst: int, limit: int, folder: Path, timeout: float | None) -> None:
    """Everything from the pipe `src` into the file `dst`, at most `limit` bytes, within
    `timeout` seconds (None: no bound)."""
    total, spliced = 0, True
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        threads.check_stop()  # its caller was cancelled: tar is stopped
        if deadline is not None and timeout is not None:
            _wait_readable(src, deadline, timeout, folder)
        want = min(CHUNK, limit + 1 - total)
        if spliced:
            try:
                moved = os.splice(src, dst, want)
            except OSError as exc:  # a file system without splice: by hand
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                spliced = False
                continue
        else:
            data = os.read(src, want)
            moved = len(data)
            write_all(dst, data)
        if moved == 0:
            return
        total += moved
        if total > limit:
            raise OutputLimitExceeded(
                f"{folder} packs to more than the limit of {limit} bytes (pass limit= or set "
                f"{FILE_LIMIT_ENV})"
            )


def _wait_readable(fd: int, deadline: float, timeout: float, folder: Path) -> None:
    """Wait for tar's next bytes until `deadline`: past it, SandboxFileTimeout."""
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([fd], [], [], left)[0]:
        raise SandboxFileTimeout(
            f"packing {folder} took more than {timeout:g} s, so it was stopped; pass a longer "
            "timeout, or make the folder smaller",
            path=str(folder),
            timeout=timeout,
        )


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
        self._proc = subprocess.Popen(tar_argv(tar, stream.folder), stdout=fd, stderr=self._errors)

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


def tar_argv(tar: str, folder: Path) -> list[str]:
    """The host's tar packing `folder` (its content, links as links) onto stdout, in 1 MiB
    records: the one spelling of it, for a stream and for a snapshot's part file alike."""
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
            tar_argv(tar, folder), stdout=subprocess.PIPE, stderr=errors, bufsize=0
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
