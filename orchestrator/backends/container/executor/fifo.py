"""A command's output (or input) carried by a FIFO in the folder the container shares
with this machine, instead of by the executor's frames: the FIFO made there (`SharedFifo`),
what the host passes the executor (`Fifo`), and how the host reads it beside the frames
(`FifoReader`)."""

from __future__ import annotations

import array
import contextlib
import fcntl
import logging
import os
import select
import tempfile
import termios
import threading
import time
import uuid
from pathlib import Path
from typing import NamedTuple

from orchestrator import procutil
from orchestrator.backends.container.layout import IO_MOUNT
from orchestrator.procutil import F_SETPIPE_SZ
from orchestrator.sandbox import files
from orchestrator.sandbox.streams import Feeder

log = logging.getLogger("orchestrator.docker")


class Fifo(NamedTuple):
    """A FIFO in the folder the container shares with this machine, which the executor opens
    itself (as root: the FIFO has mode 0, so no other sandbox user can) and gives the
    command as its standard output (`into` False: `fd` is our non-blocking read end) or its
    standard input (`into` True: this machine's tar writes it; `fd` is not read here)."""

    inside: str
    fd: int
    into: bool


class FifoReader:
    """The FIFO a command writes its output into, read beside the executor's frames. After
    the command's exit, reading goes on until the end of file, or until the FIFO is found
    empty: what the command wrote was in it before it exited (a write to a pipe is done
    once it returns), so nothing it wrote is lost, while a process it left behind (or the
    sandbox: gVisor holds a FIFO's host end a while after the last close) cannot hold the
    call; and at most DRAIN_MAX seconds of our own time (the time the caller holds a chunk
    not counted), however fast bytes keep trickling in."""

    def __init__(self, fd: int) -> None:
        self.fd, self.ended = fd, False
        self._exited_at: float | None = None
        self._dry = False  # found empty since the exit
        self._held = 0.0  # seconds the caller held chunks since the exit

    def read(self, busy: bool) -> bytes:
        """A chunk, or b"" (none now); waits a little unless frames are waiting (`busy`) or
        the command has exited (then what is in the FIFO is all it wrote)."""
        exited = self._exited_at is not None
        wait = 0.0 if busy or exited else 0.01
        try:
            data = (
                os.read(self.fd, procutil.CHUNK)
                if select.select([self.fd], [], [], wait)[0]
                else None
            )
        except BlockingIOError:
            data = None
        if data is None:
            self._dry = self._dry or exited
            return b""
        if not data:
            self.ended = True
        return data

    def handed_back(self, since: float) -> None:
        """The caller is done with the chunk handed to it at `since`: not our time."""
        if self._exited_at is not None:
            self._held += time.monotonic() - max(since, self._exited_at)

    def exited(self) -> None:
        self._exited_at = time.monotonic()

    def finished(self) -> bool:
        """Whether to stop reading: the end of file, or after the exit, the FIFO found
        empty or read long enough."""
        if self.ended:
            return True
        if self._exited_at is None:
            return False
        return self._dry or time.monotonic() - self._exited_at - self._held > procutil.DRAIN_MAX


class SharedFifo:
    """A new FIFO in a container's transfer folder (seen by that container alone, at
    IO_MOUNT): `inside`, its path in the container, and `fd`, our end of it. It has mode 0
    before the sandbox can see it (made in a private folder beside the transfer folders,
    never mounted, opened, then moved in): no sandbox user but root (the executor, which
    hands it to the command) can open it; a root sandbox can do anything in itself anyway,
    and what comes out of the sandbox stays untrusted wherever it passes.
    Out of the sandbox we read it (opened without waiting for a writer). Into the sandbox we
    open it for reading and writing, so we never wait for a reader to open it, and keep that
    end: a FIFO with no end open drops its data, and the reader may open after the packer
    exited; it goes once all was read. The packer gets `writer`, a write-only end (see
    `drop_writer`)."""

    def __init__(self, folder: Path, into_sandbox: bool) -> None:
        name = f"{'in' if into_sandbox else 'out'}-{uuid.uuid4().hex}"
        self._lock = threading.Lock()
        self.path, self.inside, self.into = folder / name, f"{IO_MOUNT}/{name}", into_sandbox
        self.fd = self.writer = -1
        private = Path(tempfile.mkdtemp(prefix=".fifo-", dir=folder.parent))
        made = private / name
        try:
            os.mkfifo(made, 0o600)
            flags = os.O_RDWR if into_sandbox else os.O_RDONLY | os.O_NONBLOCK
            self.fd = os.open(made, flags | os.O_CLOEXEC)
            if into_sandbox:  # (non-blocking only to open: our own end reads)
                self.writer = os.open(made, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                os.set_blocking(self.writer, True)
            made.chmod(0)
            os.rename(made, self.path)
        except OSError:
            self.drop_writer()
            self.release()
            raise
        finally:
            made.unlink(missing_ok=True)
            private.rmdir()
        with contextlib.suppress(OSError):  # bigger reads where Linux allows it
            fcntl.fcntl(self.fd, F_SETPIPE_SZ, files.STREAM_CHUNK)

    @property
    def end(self) -> Fifo:
        return Fifo(self.inside, self.fd, self.into)

    def drop_writer(self) -> None:
        """Close our copy of the packer's end: once the packer holds the only write-only
        end, it gets EPIPE (it dies) when no reader is left, as when we die mid-upload and
        the sandbox stops."""
        if self.writer >= 0:
            os.close(self.writer)
            self.writer = -1

    @classmethod
    def make(cls, folder: Path, into_sandbox: bool) -> SharedFifo | None:
        """A FIFO, or None where none can be made (the folder gone, a file system without)."""
        try:
            return cls(folder, into_sandbox)
        except OSError as exc:
            log.info("cannot make a FIFO in %s: %s", folder, exc)
            return None

    def release(self) -> None:
        """Close our end."""
        with self._lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1

    def release_when_read(self, packer: Feeder) -> None:
        """Once the packer has exited, wait until nothing it wrote is left unread, then
        close our end: the reader's end of file. (A reader that opens only after that, as
        when the packer failed at once, gets it at once: the executor opens without waiting
        for a writer, and a FIFO without one reads as ended.)"""
        packer.wait()
        while True:
            with self._lock:
                if self.fd < 0:
                    return  # closed meanwhile: the command ended
                left = array.array("i", [0])
                fcntl.ioctl(self.fd, termios.FIONREAD, left)
                if left[0] == 0:
                    os.close(self.fd)
                    self.fd = -1
                    return
            time.sleep(0.002)

    def close(self) -> None:
        self.drop_writer()
        self.release()
        self.path.unlink(missing_ok=True)
