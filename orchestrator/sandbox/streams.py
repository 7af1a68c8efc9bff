"""Archives sent into a sandbox as they are read, never whole in memory: a local folder packed
while it is sent (hostpack.PackStream), or an archive file of this machine (ArchiveFile: a
snapshot put back). Either goes by chunks (iterating it, for any backend), or, where a
backend hands the sandbox a FIFO of this machine, is written into that FIFO by a helper of
this machine (`pack_into`): the host's tar for a folder, the kernel (sendfile, no copy
through this process) for a file."""

from __future__ import annotations

import os
import select
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from orchestrator.errors import OrchestratorError, UsageError

CHUNK = 1 << 20
POLL_MS = 100
"""Longest a feeder waits for room in the FIFO before it looks whether it was stopped."""
STOP_WAIT = 2.0
"""Longest stop() waits for a feeder's thread (it looks every POLL_MS)."""


class Feeder:
    """A helper writing an archive into a FIFO the sandbox reads."""

    def wait(self) -> None:
        """Until everything was written (or the helper gave up)."""
        raise NotImplementedError

    def stop(self) -> None:
        """The reading side is done: a helper still waiting to write is stopped; a failure
        of its own becomes the stream's error."""
        raise NotImplementedError


class ArchiveStream:
    """An archive to send into a sandbox. A failure while reading or packing it ends the
    stream early and is kept in `error`, for the caller to raise once the other side has
    given up on the truncated archive. Each use (an iteration, a `pack_into`) starts from
    the archive's beginning."""

    error: OrchestratorError | None = None

    def __iter__(self) -> Iterator[bytes]:
        raise NotImplementedError

    def pack_into(self, fd: int) -> Feeder | None:
        """Start writing the archive into `fd` (a FIFO the sandbox reads), or None where
        this machine cannot (the caller then iterates). `fd` should be a write-only end,
        so that the writer gets EPIPE once no reader is left; the caller may close its own
        copy as soon as this returns."""
        return None

    def failed(self, why: str) -> None:
        """Keep the first reason the stream failed, for the caller to raise."""
        if self.error is None:
            self.error = UsageError(why)


class ArchiveFile(ArchiveStream):
    """A regular file of this machine holding an archive (a snapshot), opened at once (an
    unreadable file, or one that is not a regular file, raises UsageError here). Use as a
    context manager, or close()."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise UsageError(f"cannot read snapshot {path}: {exc.strerror}") from None
        if not stat.S_ISREG(os.fstat(self._fd).st_mode):  # a FIFO or a device: never
            os.close(self._fd)
            raise UsageError(f"cannot read snapshot {path}: not a regular file")
        os.set_blocking(self._fd, True)

    def __enter__(self) -> ArchiveFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("the archive file is closed")
        return self._fd

    def __iter__(self) -> Iterator[bytes]:
        offset = 0
        try:
            while chunk := os.pread(self.fileno(), CHUNK, offset):
                offset += len(chunk)
                yield chunk
        except OSError as exc:
            self.failed(f"cannot read snapshot {self.path}: {exc.strerror}")

    def pack_into(self, fd: int) -> Feeder | None:
        try:
            return FileInto(self, fd)
        except RuntimeError:
            return None  # the caller iterates instead


class FileInto(Feeder):
    """An ArchiveFile written into a FIFO by the kernel (sendfile: file to pipe, no copy
    through this process), from a thread that never waits more than POLL_MS at a time, so
    stop() ends it however full the FIFO is."""

    def __init__(self, source: ArchiveFile, fd: int) -> None:
        self._source = source
        # copies of our own, closed when done: the caller drops its end, and closing the
        # ArchiveFile while this still runs must not leave it reading a reused descriptor
        self._src, self._out = os.dup(source.fileno()), os.dup(fd)
        os.set_blocking(self._out, False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, name="FileInto", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:  # no thread left (a pids limit of this process)
            os.close(self._src)
            os.close(self._out)
            raise

    def _send(self) -> None:
        offset, src = 0, self._src
        poller = select.poll()
        poller.register(self._out, select.POLLOUT)
        try:
            while not self._stop.is_set():
                try:
                    sent = os.sendfile(self._out, src, offset, CHUNK)
                except BlockingIOError:
                    poller.poll(POLL_MS)  # no room: wait for the reader, briefly
                    continue
                if sent == 0:
                    return
                offset += sent
        except BrokenPipeError:
            pass  # the reader stopped: the command's side says why
        except OSError as exc:
            self._source.failed(f"cannot read snapshot {self._source.path}: {exc.strerror}")
        finally:
            os.close(self._out)
            os.close(self._src)

    def wait(self) -> None:
        self._thread.join()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(STOP_WAIT)
