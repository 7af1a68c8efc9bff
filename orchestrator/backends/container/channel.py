"""How commands reach one container of a Docker environment (the main sandbox or a service):
its in-container executor, started once and restarted if it dies, or plain `docker exec` per
command where the executor cannot run (no python3) or cannot act as the command's user.

A folder's archive, out of the container or into it, takes a shorter way where the container
sees a folder of this machine (its own transfer folder, bind-mounted read-only at IO_MOUNT into
that container alone): a FIFO made there, written on one side and read on the other, so the
bytes skip the engine's exec stream (the container's runtime shim, the daemon and the docker
client each copy them). The FIFO has mode 0: the executor (root, with CAP_DAC_OVERRIDE) opens
it and hands it to the command, so no other user of the sandbox can read an upload or write
into a download; and no other container sees it, so root there cannot either. Where the
executor cannot (plain `docker exec`), archives take the exec stream."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Literal

from orchestrator import procutil
from orchestrator.backends.container.engine import Engine, exec_refused_as_it_died
from orchestrator.backends.container.executor import wire
from orchestrator.backends.container.executor.client import ExecutorClient
from orchestrator.backends.container.executor.fifo import SharedFifo
from orchestrator.backends.container.executor.plain import MARK, Killer, run_plain
from orchestrator.backends.container.layout import IO_MOUNT, SANDBOX_MOUNT
from orchestrator.backends.container.owed import Owed
from orchestrator.errors import ExecutorLost, OrchestratorError, SandboxPaused, SandboxUnavailable
from orchestrator.sandbox.options import AChunks, Chunks, Command
from orchestrator.sandbox.results import Outcome, StreamKind
from orchestrator.sandbox.streams import ArchiveStream
from orchestrator.sandbox.threads import SingleFlight, in_thread, thread_chunks

log = logging.getLogger("orchestrator.docker")
READY_TIMEOUT = 15.0
"""How long an executor has to greet before it is looked at: one that said anything (an image
without its Python), died, or whose container is gone is judged then."""
READY_MOST = 60.0
"""How long a channel's first executor, still starting, silent, in a container that runs
(not paused), is waited for from its start: a loaded machine (a full test run on two cores)
has taken over 15 s to start one, and falling back to plain `docker exec` for good costs
every later command its start-up (and a terminal cannot go plain at all). One started again
after it worked is judged at READY_TIMEOUT. A command whose own timeout runs out first
runs plain meanwhile (`ready`)."""
READY_LOOK = 2.0
"""How often that longer wait looks again whether it is still worth it."""
Mode = Literal["auto", "executor", "plain"]
ROOT = (None, "0", "0:0")
"""Users a root executor without CAP_SETUID can still run commands as (itself)."""
NO_FIFO = wire.NO_FIFO
"""The exit status of a command whose FIFO the executor could not open (nothing ran)."""
LOST_WITHIN = 2.0
"""How long a dead executor's container may still read as running before we believe it."""
KILLED_EXIT = 128 + 9
PLAIN_LOST_WITHIN = 1.0
"""How long a plain command's container, after the command ended by SIGKILL, may still read
as running before we believe it, where this machine cannot see that it runs on (an engine in
a VM): a command killed in a running sandbox there waits this long."""
NO_PYTHON = re.compile(r"executable file .{0,80}not found|not found in \$PATH", re.IGNORECASE)
"""What the engine says of an image with no python3 for the executor (Docker's and Podman's
words): plain `docker exec` from then on, at once."""
PROBE_TIMEOUT = 5.0
"""Longest the one-time FIFO check may take (an engine in a VM: its bind mounts copy files,
not FIFOs)."""


class Channel:
    def __init__(
        self,
        *,
        label: str,
        engine: Engine,
        container: str,
        mode: Mode,
        owned: bool,
        lost: Callable[[], SandboxUnavailable | None],
        killed: Callable[[], bool],
        running: Callable[[], bool],
        warn: Callable[[str], None],
        shared: Path | None = None,
        owed: tuple[Owed, str] | None = None,
    ) -> None:
        self.label = label
        self.mode = mode
        self._engine = engine
        self._container = container
        self._owned = owned
        self._lost = lost
        self._killed = killed
        self._running = running
        """Whether the container visibly runs on (False: it cannot be told here)."""
        self._warn = warn
        self._executor: ExecutorClient | None = None
        self._greeted = False  # (an executor has greeted once: a restart gets no long wait)
        self._since = 0.0  # when the current executor was started
        self._lock = threading.Lock()
        # the host folder this container alone sees at IO_MOUNT, and whether a FIFO made
        # there reaches this process (None: not yet tried)
        self._shared = shared
        self._fifo_ok: bool | None = None if shared is not None else False
        self._verdict = SingleFlight()
        """Whether a container whose executor never greeted is gone, asked once for all."""
        self._asked = SingleFlight()
        """Why the executor was lost, asked once for all the async calls that lost it."""
        self._owed = owed
        """The kills owed in the environment, and this container's service (see owed.py)."""

    # ----- the executor ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the executor now (it greets while the caller does other work)."""
        if self.mode != "plain":
            with self._lock:
                if self._executor is None:
                    self._executor = self._new_executor()

    def _new_executor(self) -> ExecutorClient:
        command = [
            "python3",
            "-u",
            "-I",  # isolated: no user site, no PYTHON* variables of the sandbox
            "-S",  # no site import: a faster start
            f"{SANDBOX_MOUNT}/agent.py",
            # owned: when this process dies, by any signal, the container stops itself
            *(["--owned"] if self._owned else []),
        ]
        self._since = time.monotonic()
        target = self._engine.exec_target(self._container)
        shared = None if self._shared is None else (self._shared, IO_MOUNT)
        client = ExecutorClient(
            target.argv(command, user="0", stdin=True), direct=shared, owned=self._owned
        )
        client.start()
        return client

    @property
    def transport(self) -> str:
        """What carries this container's commands now: "socket" or "pipes" (the executor's,
        with why not a socket when one was tried), "plain docker exec", or "not started"."""
        if self.mode == "plain":
            return "plain docker exec"
        ex = self._executor
        return "not started" if ex is None or not ex.ready_now else ex.transport

    def ready(self, within: float | None = None) -> ExecutorClient | None:
        """The live executor (restarted if it died), or None where commands go plain.
        `within`: the timeout of the command it is asked for. Should that run out while the
        executor is still starting (see READY_MOST), this command goes plain (None) and the
        executor starts on for the next: one caller's short timeout never decides for all."""
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
            began, first = self._since, not self._greeted
        budget = began + (READY_MOST if first else READY_TIMEOUT)  # the executor's own
        mine = math.inf if within is None else time.monotonic() + within
        ready = ex.wait_ready(max(0.0, min(began + READY_TIMEOUT, mine) - time.monotonic()))
        if not ready and first:
            ready = self._started_late(ex, min(budget, mine))
        if ready:
            self.mode, self._greeted = "executor", True
            return ex
        if mine < budget and time.monotonic() >= mine and self._starting(ex):
            return None
        if ex.greeted_late():
            self.mode, self._greeted = "executor", True
            return ex
        waited = time.monotonic() - began
        ex.close()  # also collects what it printed before dying
        said = ex.stderr_tail
        reason = said or f"no answer within {waited:.0f} s"
        with self._lock:
            if self._executor is ex:
                self._executor = None
        # an executor killed with its container says nothing, or anything (runc's words for
        # an exec into a stopping container, a python3's warning), and a loaded engine
        # records the stop a moment later: unless the image cannot run the executor (its
        # words) or the container visibly runs on, it is asked again for a while, once for
        # every caller waiting here, so a sandbox that died as it started is never taken
        # for an image without the executor's Python
        if NO_PYTHON.search(said) is not None or self._running():
            lost = self._lost()
        else:
            lost = self._verdict.blocking(self._lost_soon)
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

    def _started_late(self, ex: ExecutorClient, until: float) -> bool:
        """After READY_TIMEOUT: whether a first executor greeted by `until`, waited for only
        while it runs, has said nothing, and its container runs on, neither paused nor gone
        (looked at every READY_LOOK seconds; an engine that cannot say ends the wait)."""
        while (left := until - time.monotonic()) > 0:
            try:
                if not self._starting(ex) or not self._running() or self._lost() is not None:
                    return False
            except OrchestratorError:
                return False
            if ex.wait_ready(min(READY_LOOK, left)):
                return True
        return False

    @staticmethod
    def _starting(ex: ExecutorClient) -> bool:
        """Whether an executor that has not greeted may still: it runs and has said nothing."""
        return ex.alive and not ex.stderr_tail

    def shutdown(self) -> None:
        """Ask the executor to stop, without waiting (the container is going down)."""
        if self._executor is not None:
            self._executor.shutdown()

    def close(self, release: bool = True) -> None:
        with self._lock:
            ex, self._executor = self._executor, None
            self._greeted = False  # (one started after this is a first again: a restore's)
        if ex is not None:
            ex.close(release=release)

    # ----- commands ----------------------------------------------------------------------------
    def run(self, cmd: Command, *, bulk: bool = False) -> Chunks:
        """Run one command. `bulk`: a folder's archive, out (the command prints it) or in
        (its stdin a streams.ArchiveStream), through a FIFO where one works; otherwise an
        archive out goes by plain exec, whose output crosses one process less than through
        the executor, which matters for 100 MB more than the exec's start-up does."""
        if self._owed is not None:
            self._owed[0].settle()  # nothing runs before a command it failed is killed
        if bulk and self._fifo_works(cmd):
            stream = cmd.stdin if isinstance(cmd.stdin, ArchiveStream) else None
            routed = yield from (
                self._out_by_fifo(cmd) if stream is None else self._in_by_fifo(cmd, stream)
            )
            if routed is not None:
                return routed
        return (yield from self._run(cmd, plain=bulk and cmd.stdin is None))

    def _run(
        self,
        cmd: Command,
        *,
        plain: bool = False,
        out: SharedFifo | None = None,
        into: SharedFifo | None = None,
    ) -> Chunks:
        """By the executor (unless `plain`, or where it cannot run); `out` / `into`: a FIFO
        carrying the command's output / input, which only the executor can hand over (exit
        NO_FIFO, nothing run, where it is not used)."""
        ex = None if plain else self._executor_for(cmd)
        fifo = out or into
        if ex is None:
            if fifo is not None:
                return Outcome(NO_FIFO, False, 0.0)
            return (yield from self._plain(cmd))
        started = time.monotonic()
        killer, marked = self._marked(cmd)
        try:
            end = fifo.end if fifo is not None else None
            return (yield from ex.run(marked, procutil.GRACE, self._lost, end))
        except ExecutorLost as exc:
            return self._executor_lost(ex, exc, started)
        except SandboxPaused:
            self._owe_kill(killer)  # its caller is told it failed: it must not run on
            raise

    def _marked(self, cmd: Command) -> tuple[Killer, Command]:
        """A command for the executor, marked (as the plain path marks its own) so that it
        can be killed while its sandbox is paused, and the killer that finds it by that mark
        (as its user: the executor runs one that names none as root)."""
        killer = Killer(self._engine, self._container, cmd.user or "0")
        return killer, dataclasses.replace(cmd, env={**cmd.env, MARK: killer.token})

    def _owe_kill(self, killer: Killer) -> None:
        """A command whose call raised SandboxPaused is killed (see owed.py)."""
        if self._owed is not None:
            self._owed[0].owe(self._owed[1], killer)

    def _executor_lost(self, ex: ExecutorClient, exc: ExecutorLost, started: float) -> Outcome:
        """A command's executor died under it: 137 when kill() did it (as SIGKILL ends a
        process); otherwise why the sandbox is gone, or ExecutorLost. Blocks (engine calls)."""
        return _after_loss(self._why_lost(ex), exc, started)

    def _why_lost(self, ex: ExecutorClient) -> SandboxUnavailable | bool:
        """After its executor died: True when kill() did it; else why the sandbox is gone, or
        False (it is not: only the executor died). Closes the dead executor."""
        if self._killed():
            return True
        ex.close()  # the next command starts a fresh one
        return self._lost_soon() or False

    async def arun(self, cmd: Command) -> AChunks:
        """`run` (not bulk) for an asyncio caller: natively through a running executor; where
        none runs yet, or it cannot run `cmd`, by the blocking path in a thread of its own
        (threads.thread_chunks), which starts one or goes plain as `run` does."""
        ex = self._executor if self.mode != "plain" else None
        owing = self._owed is not None and self._owed[0].owing  # (settled by the blocking way)
        if ex is None or not ex.ready_now or not _runs_as(ex, cmd) or owing:
            async with contextlib.aclosing(thread_chunks(lambda: self.run(cmd))) as way:
                async for item in way:
                    yield item
            return
        started = time.monotonic()
        killer, marked = self._marked(cmd)
        try:
            async with contextlib.aclosing(ex.arun(marked, procutil.GRACE, self._lost)) as way:
                async for item in way:
                    yield item
        except ExecutorLost as exc:
            # asked once for every call that lost this executor (a thousand may be waiting)
            dead = ex
            yield _after_loss(await self._asked(lambda: self._why_lost(dead)), exc, started)
        except SandboxPaused:
            await in_thread(lambda: self._owe_kill(killer))  # (engine calls: a thread)
            raise

    def _executor_for(self, cmd: Command) -> ExecutorClient | None:
        """The executor, where it runs and can run `cmd` as its user."""
        ex = self.ready(cmd.timeout)
        if ex is not None and not _runs_as(ex, cmd):
            return None  # root without CAP_SETUID here (a non-root service): docker exec -u
        return ex

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
        fifo = SharedFifo.make(self._shared, into_sandbox=False)
        if fifo is None:
            return None
        try:
            # the bytes skip the executor too: it starts the command sooner than docker exec
            outcome = yield from self._run(cmd, out=fifo)
        finally:
            fifo.close()
        return self._routed(outcome)

    def _in_by_fifo(
        self, cmd: Command, stream: ArchiveStream
    ) -> Generator[tuple[StreamKind, bytes], None, Outcome | None]:
        """The command's input through a FIFO the host's tar writes into; None as above."""
        assert self._shared is not None
        fifo = SharedFifo.make(self._shared, into_sandbox=True)
        if fifo is None:
            return None
        try:
            packer = stream.pack_into(fifo.writer)
            fifo.drop_writer()  # tar's now: when the sandbox's end goes, tar gets EPIPE
            if packer is None:
                return None
            # once tar has exited and the sandbox has read all it wrote, our end goes: the
            # reader then gets its end of file (busybox's tar reads to it)
            threading.Thread(target=fifo.release_when_read, args=(packer,), daemon=True).start()
            try:
                outcome = yield from self._run(dataclasses.replace(cmd, stdin=None), into=fifo)
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

    def _plain(self, cmd: Command) -> Chunks:
        killer = Killer(self._engine, self._container, cmd.user)
        outcome = yield from run_plain(self._engine, self._container, cmd, killer=killer)
        failed = outcome.exit_code != 0 or outcome.timed_out
        if failed and not self._killed():  # the command failed, or the container did?
            # a container killed under it ends `docker exec` with 137, a moment before the
            # engine records that it stopped: unless it visibly runs on (only the command
            # was killed), that one is asked again for a while
            killed = outcome.exit_code == KILLED_EXIT and not outcome.timed_out
            if killed and self._running():
                return outcome
            # so with an exec refused as the container stopped under it (runc's words, 126)
            dying = killed or exec_refused_as_it_died(killer.refusal)
            lost = self._lost_soon(PLAIN_LOST_WITHIN) if dying else self._lost()
            if isinstance(lost, SandboxPaused):  # the engine refused the killer too
                self._owe_kill(killer)
            if lost is not None:
                raise lost
        return outcome

    def _fifo_works(self, cmd: Command) -> bool:
        """Whether a FIFO in the container's transfer folder, opened by the executor in the
        container, is read here (the engine runs on this machine's kernel, and the executor
        may open it): tried once, by a command that writes "ok". Never where the executor
        cannot run `cmd`: a FIFO the command's user opened itself would be one any user could
        open."""
        if self._fifo_ok is False or self._executor_for(cmd) is None:
            return False
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


def _runs_as(ex: ExecutorClient, cmd: Command) -> bool:
    """Whether the executor can run `cmd` as its user (one without CAP_SETUID: only as
    itself, root)."""
    return bool(ex.info.get("setuid", True)) or cmd.user in ROOT


def _after_loss(why: SandboxUnavailable | bool, exc: ExecutorLost, started: float) -> Outcome:
    """A lost call's end, given Channel._why_lost: 137 (killed), or the error to raise."""
    if why is True:
        return Outcome(137, False, time.monotonic() - started)
    if isinstance(why, SandboxUnavailable):
        raise why from exc
    raise exc
