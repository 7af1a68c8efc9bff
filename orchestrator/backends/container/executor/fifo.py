"""A command's output (or input) carried by a FIFO in the folder the container shares
with this machine, instead of by the executor's frames: what the host passes the executor
(`Fifo`), and how the host reads it beside the frames (`FifoReader`)."""

from __future__ import annotations

import os
import select
import time
from typing import NamedTuple

from orchestrator import procutil


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
    the command's exit, reading goes on until the end of file or, as in `procutil.pump`,
    DRAIN seconds of quiet (a process it left, or the sandbox, may hold the FIFO open),
    and at most DRAIN_MAX seconds of our own time: the time the caller holds a chunk is
    neither quiet nor counted, so a slow caller loses nothing the packer wrote, while
    bytes trickling in cannot hold the call."""

    def __init__(self, fd: int) -> None:
        self.fd, self.ended = fd, False
        self._exited_at: float | None = None
        self._last = time.monotonic()
        self._held = 0.0  # seconds the caller held chunks since the exit

    def read(self, busy: bool) -> bytes:
        """A chunk, or b"" (none now); waits a little unless frames are waiting (`busy`)."""
        wait = 0.0 if busy else 0.05 if self._exited_at is not None else 0.01
        if not select.select([self.fd], [], [], wait)[0]:
            return b""
        try:
            data = os.read(self.fd, procutil.CHUNK)
        except BlockingIOError:
            return b""
        if not data:
            self.ended = True
        return data

    def handed_back(self, since: float) -> None:
        """The caller is done with the chunk handed to it at `since`: quiet counts from now."""
        self._last = now = time.monotonic()
        if self._exited_at is not None:
            self._held += now - max(since, self._exited_at)

    def exited(self) -> None:
        self._exited_at = self._last = time.monotonic()

    def finished(self) -> bool:
        """Whether to stop reading: the end of file, or after the exit, quiet long enough or
        reading long enough."""
        if self.ended:
            return True
        if self._exited_at is None:
            return False
        now = time.monotonic()
        quiet, spent = now - self._last, now - self._exited_at - self._held
        return quiet >= procutil.DRAIN or spent > procutil.DRAIN_MAX
