"""How commands reach one container of a Docker environment (the main sandbox or a service):
its in-container executor, started once and restarted if it dies, or plain `docker exec` per
command where the executor cannot run (no python3) or cannot act as the command's user.

A folder's archive, out of the container or into it, takes a shorter way where the container
sees a folder of this machine (its sandbox folder, bind-mounted read-only): a FIFO made there,
written on one side and read on the other, so the bytes skip the engine's exec stream (the
container's runtime shim, the daemon and the docker client each copy them)."""

from __future__ import annotations

import array
import contextlib
import dataclasses
import fcntl
import logging
import os
import termios
import threading
import time
import uuid
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Literal

from orchestrator import procutil
from orchestrator.compile.render import SANDBOX_MOUNT
from orchestrator.errors import ExecutorLost, SandboxUnavailable
from orchestrator.procutil import F_SETPIPE_SZ
from orchestrator.runtime import files
from orchestrator.runtime.executor.client import ExecutorClient
from orchestrator.runtime.executor.plain import run_plain
from orchestrator.runtime.options import Chunks, Command
from orchestrator.runtime.results import Outcome, StreamKind

log = logging.getLogger("orchestrator.docker")
READY_TIMEOUT = 15.0
Mode = Literal["auto", "executor", "plain"]
ROOT = (None, "0", "0:0")
"""Users a root executor without CAP_SETUID can still run commands as (itself)."""
# `sh -c TO_FIFO sh FIFO ARGV...`: ARGV's output into the FIFO, or (FROM_FIFO) its input from
# it; 98 where the command's user cannot reach it
TO_FIFO = 'f=$1; shift; [ -p "$f" ] && [ -w "$f" ] || exit 98; exec "$@" > "$f"'
FROM_FIFO = 'f=$1; shift; [ -p "$f" ] && [ -r "$f" ] || exit 98; exec "$@" < "$f"'
NO_FIFO = 98
LOST_WITHIN = 2.0
"""How long a dead executor's container may still read as running before we believe it."""
PROBE_TIMEOUT = 5.0
"""Longest the one-time FIFO check may take: an engine in a VM (its bind mounts copy files,
not FIFOs) leaves the writer waiting for a reader that never comes."""


class Channel:
    def __init__(
        self,
        *,
        label: str,
        docker_cmd: list[str],
        container: str,
        mode: Mode,
        owned: bool,
        lost: Callable[[], SandboxUnavailable | None],
        killed: Callable[[], bool],
        warn: Callable[[str], None],
        shared: Path | None = None,
    ) -> None:
        self.label = label
        self.mode = mode
        self._docker_cmd = docker_cmd
        self._container = container
        self._owned = owned
        self._lost = lost
        self._killed = killed
        self._warn = warn
        self._executor: ExecutorClient | None = None
        self._lock = threading.Lock()
        # the host folder the container sees at SANDBOX_MOUNT, and whether a FIFO made there
        # reaches this process (None: not yet tried)
        self._shared = shared
        self._fifo_ok: bool | None = None if shared is not None else False

    # ----- the executor ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the executor now (it greets while the caller does other work)."""
        if self.mode != "plain":
            with self._lock:
                if self._executor is None:
                    self._executor = self._new_executor()

    def _new_executor(self) -> ExecutorClient:
        client = ExecutorClient(
            [
                *self._docker_cmd,
                "exec",
                "-i",
                "-u",
                "0",
                self._container,
                "python3",
                "-u",
                "-I",  # isolated: no user site, no PYTHON* variables of the sandbox
                "-S",  # no site import: a faster start
                f"{SANDBOX_MOUNT}/agent.py",
                # owned: when this process dies, by any signal, the container stops itself
                *(["--owned"] if self._owned else []),
            ]
        )
        client.start()
        return client

    def ready(self) -> ExecutorClient | None:
        """The live executor (restarted if it died), or None where commands go plain."""
        if self.mode == "plain":
            return None
        with self._lock:
            ex = self._executor
            if ex is None or not ex.alive:
                if ex is not None:
                    why = ex.stderr_tail or "no output"
                    log.warning("%s: executor died (%s); starting a new one", self.label, why)
                    ex.close()
                ex = self._executor = self._new_executor()
        if ex.wait_ready(READY_TIMEOUT):
            self.mode = "executor"
            return ex
        ex.close()  # also collects what it printed before dying
        reason = ex.stderr_tail or "no answer"
        with self._lock:
            if self._executor is ex:
                self._executor = None
        lost = self._lost()
        if lost is not None:
            raise lost
        if self.mode == "executor":
            raise ExecutorLost(f"{self.label}: the executor cannot run in this image: {reason}")
        self.mode = "plain"
        self._warn(
            f"{self.label}: the fast executor cannot run in this image ({reason}); "
            "falling back to plain `docker exec` per command"
        )
        return None

    def shutdown(self) -> None:
        """Ask the executor to stop, without waiting (the container is going down)."""
        if self._executor is not None:
            self._executor.shutdown()

    def close(self, release: bool = True) -> None:
        with self._lock:
            ex, self._executor = self._executor, None
        if ex is not None:
            ex.close(release=release)

    # ----- commands ----------------------------------------------------------------------------
    def run(self, cmd: Command, *, bulk: bool = False) -> Chunks:
        """Run one command. `bulk`: a folder's archive, out (the command prints it) or in
        (its stdin a files.PackStream), through a FIFO where one works; otherwise an
        archive out goes by plain exec, whose output crosses one process less than through
        the executor, which matters for 100 MB more than the exec's start-up does."""
        if bulk and self._fifo_works(cmd):
            stream = cmd.stdin if isinstance(cmd.stdin, files.PackStream) else None
            routed = yield from (
                self._out_by_fifo(cmd) if stream is None else self._in_by_fifo(cmd, stream)
            )
            if routed is not None:
                return routed
        return (yield from self._run(cmd, plain=bulk and cmd.stdin is None))

    def _run(self, cmd: Command, *, plain: bool = False, out: int | None = None) -> Chunks:
        """By the executor (unless `plain`, or where it cannot run); `out`: a FIFO carrying
        the command's output (see procutil.pump)."""
        ex = None if plain else self.ready()
        if ex is not None and not (ex.info.get("setuid", True) or cmd.user in ROOT):
            ex = None  # root without CAP_SETUID here (a non-root service): docker exec -u
        if ex is None:
            return (yield from self._plain(cmd, out))
        started = time.monotonic()
        try:
            return (yield from ex.run(cmd, procutil.GRACE, self._lost, out))
        except ExecutorLost as exc:
            if self._killed():  # kill() ended it, as SIGKILL ends a process
                return Outcome(137, False, time.monotonic() - started)
            ex.close()  # the next command starts a fresh one
            lost = self._lost_soon()
            if lost is not None:
                raise lost from exc
            raise

    def _lost_soon(self, within: float = LOST_WITHIN) -> SandboxUnavailable | None:
        """Why the container cannot run commands, asked again for a moment while it still
        reads as running: a killed container takes the executor down before the engine
        records that it stopped."""
        deadline = time.monotonic() + within
        while (lost := self._lost()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        return lost

    def _out_by_fifo(
        self, cmd: Command
    ) -> Generator[tuple[StreamKind, bytes], None, Outcome | None]:
        """The command's output through a FIFO; None where that could not be (nothing was
        written): the caller goes the usual way."""
        assert self._shared is not None
        fifo = _Fifo.make(self._shared, into_sandbox=False)
        if fifo is None:
            return None
        try:
            argv = ["/bin/sh", "-c", TO_FIFO, "sh", fifo.inside, *cmd.argv]
            # the bytes skip the executor too: it starts the command sooner than docker exec
            outcome = yield from self._run(dataclasses.replace(cmd, argv=argv), out=fifo.fd)
        finally:
            fifo.close()
        return self._routed(outcome)

    def _in_by_fifo(
        self, cmd: Command, stream: files.PackStream
    ) -> Generator[tuple[StreamKind, bytes], None, Outcome | None]:
        """The command's input through a FIFO the host's tar writes into; None as above."""
        assert self._shared is not None
        fifo = _Fifo.make(self._shared, into_sandbox=True)
        if fifo is None:
            return None
        try:
            packer = stream.pack_into(fifo.fd)
            if packer is None:
                return None
            # once tar has exited and the sandbox has read all it wrote, our end goes: the
            # reader then gets its end of file (busybox's tar reads to it)
            threading.Thread(target=fifo.release_when_read, args=(packer,), daemon=True).start()
            try:
                argv = ["/bin/sh", "-c", FROM_FIFO, "sh", fifo.inside, *cmd.argv]
                outcome = yield from self._run(dataclasses.replace(cmd, argv=argv, stdin=None))
            finally:
                packer.stop()
        finally:
            fifo.close()
        return self._routed(outcome)

    def _routed(self, outcome: Outcome) -> Outcome | None:
        if outcome.exit_code != NO_FIFO:
            return outcome
        self._fifo_ok = False  # not for this user: nothing went through it; the usual way
        return None

    def _plain(self, cmd: Command, out: int | None = None) -> Chunks:
        outcome = yield from run_plain(self._docker_cmd, self._container, cmd, out)
        failed = outcome.exit_code != 0 or outcome.timed_out
        if failed and not self._killed():  # the command failed, or the container did?
            lost = self._lost()
            if lost is not None:
                raise lost
        return outcome

    def _fifo_works(self, cmd: Command) -> bool:
        """Whether a FIFO in the shared folder, written in the container, is read here (the
        engine runs on this machine's kernel): tried once, by a command that writes "ok"."""
        if self._fifo_ok is None:
            probe = Command(["printf", "ok"], {}, "/", cmd.user, PROBE_TIMEOUT, None)
            said, way = b"", self._out_by_fifo(probe)
            try:
                while True:
                    kind, data = next(way)
                    said += data if kind == "stdout" else b""
            except StopIteration as stop:
                if stop.value is None and self._fifo_ok is None:
                    return False  # no FIFO could be made: tried again next time
            self._fifo_ok = said == b"ok"
            if not self._fifo_ok:
                log.info("%s: folders go through the engine's exec stream", self.label)
        return self._fifo_ok


class _Fifo:
    """A new FIFO in the shared folder: `inside`, its path in the container, and `fd`, our
    end of it. Out of the sandbox: any sandbox user may write it, none may read it, and we
    read it (opened without waiting for a writer); what comes out of the sandbox is
    untrusted wherever it passes. Into the sandbox: any sandbox user may read it. We open it
    for reading and writing and hand it to the packer, so the packer never waits for a
    reader to open it and never sees one leave (it is stopped once the command ended); our
    end keeps what it wrote even if the reader opens after it exited (a FIFO with no end
    open drops its data), and goes once all of that was read."""

    def __init__(self, folder: Path, into_sandbox: bool) -> None:
        name = f"{'in' if into_sandbox else 'out'}-{uuid.uuid4().hex}"
        self._lock, self._ended = threading.Lock(), threading.Event()
        self.path, self.inside = folder / name, f"{SANDBOX_MOUNT}/{name}"
        os.mkfifo(self.path)
        try:
            self.path.chmod(0o644 if into_sandbox else 0o622)
            flags = os.O_RDWR if into_sandbox else os.O_RDONLY | os.O_NONBLOCK
            self.fd = os.open(self.path, flags | os.O_CLOEXEC)
        except OSError:
            self.path.unlink(missing_ok=True)
            raise
        with contextlib.suppress(OSError):  # bigger reads where Linux allows it
            fcntl.fcntl(self.fd, F_SETPIPE_SZ, files.STREAM_CHUNK)

    @classmethod
    def make(cls, folder: Path, into_sandbox: bool) -> _Fifo | None:
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

    def release_when_read(self, packer: files.TarInto) -> None:
        """Once the packer has exited, wait until nothing it wrote is left unread, then
        close our end: the reader's end of file."""
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
                    break
            time.sleep(0.002)
        # A reader that opens only now (the packer failed before writing anything) would
        # wait for a writer forever: be one for a moment, each time one waits, until the
        # command has ended.
        while not self._ended.wait(0.01):
            with contextlib.suppress(OSError):  # ENXIO: no reader waits
                os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))

    def close(self) -> None:
        self._ended.set()
        self.release()
        self.path.unlink(missing_ok=True)
