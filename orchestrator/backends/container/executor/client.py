"""Host side of the executor: one long-lived `docker exec -i` per environment, speaking the
framed protocol of `wire`. Many commands may be in flight at once; if the executor dies,
commands in flight get ExecutorLost and the owner starts a new one for the next command.

No wait here is unbounded: the reader thread never blocks on a consumer (output is paced per
command by credit), a silent executor is pinged, and when it does not answer the owner's
`probe` says whether the sandbox itself is gone or paused (SandboxUnavailable).

Nor is any buffer: the executor is the image's own python3, which a root sandbox can replace,
so what it sends is held to the protocol. A frame over procutil.CHUNK bytes, more output
frames than a command's credit allows, or a frame of a kind the host does not expect ends
that executor (ExecutorLost for its commands; the next command starts a new one)."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
import weakref

from orchestrator import procutil
from orchestrator.backends.container.executor import wire
from orchestrator.backends.container.executor.fifo import Fifo, FifoReader
from orchestrator.backends.container.executor.link import Link, Probe, Waker
from orchestrator.errors import ExecutorLost, ProcessNotFound
from orchestrator.sandbox.live import LiveInput
from orchestrator.sandbox.options import AChunks, Chunks, Command, stdin_chunks
from orchestrator.sandbox.results import Outcome, StreamKind

__all__ = ["ExecutorClient", "Fifo"]

BACKSTOP = 2.0
"""Seconds past a command's own timeout (and grace) before the host asks the executor to kill
it again, and as long again before it declares the executor lost."""
KILL_WITHIN = 5.0
"""Longest a cancelled call waits for the executor to report its killed command's exit
(milliseconds, unless the sandbox is paused or overloaded meanwhile)."""


class ExecutorClient(Link):
    """Commands run through one executor, many in flight at once (see the module)."""

    def run(
        self, cmd: Command, grace: float, probe: Probe | None = None, fifo: Fifo | None = None
    ) -> Chunks:
        """Run one command through the executor. `fifo`: its output (or input) goes through
        that FIFO instead (see Fifo). Output read from it comes as "stdout" chunks, as it
        arrives, and after the command exits until the FIFO's end of file, until it is found
        empty, or DRAIN_MAX seconds in all (time the caller holds a chunk not counted), even
        if bytes keep trickling in: a sandbox process may hold it open and write."""
        call = _Call(self, cmd, grace)
        try:
            call.start(fifo)
            if isinstance(live := cmd.stdin, LiveInput):  # written as it runs: fed beside
                procutil.in_thread(lambda: self._feed(call, live, probe))  # its output
            elif cmd.stdin is not None:
                for chunk in stdin_chunks(cmd.stdin):
                    if procutil.abandoned():  # its caller left while it was fed
                        return Outcome(137, False, 0.0)
                    self.send(wire.STDIN, call.cid, chunk, waiting=lambda: self.silence(probe))
                self.send(wire.STDIN_EOF, call.cid)
            call.arm()
            reader = FifoReader(fifo.fd) if fifo is not None and not fifo.into else None
            frames = call.inbox.frames
            ended: Outcome | None = None
            while True:
                if reader is not None:
                    if reader.finished():
                        reader = None
                        if ended is not None:
                            return ended
                        continue
                    chunk = reader.read(busy=not frames.empty())
                    if chunk:
                        since = time.monotonic()
                        yield "stdout", chunk
                        reader.handed_back(since)
                    if ended is not None:
                        continue  # the command's end: only the FIFO is left to read
                try:
                    kind, payload = frames.get(timeout=0.25 if reader is None else 0.0)
                except queue.Empty:
                    if procutil.abandoned():  # its caller left (threads.thread_chunks)
                        return Outcome(137, False, 0.0)  # nobody reads it; end() kills it
                    # looked at however busy the FIFO is: bytes trickling into it must not
                    # keep a paused sandbox or a lost executor from being noticed
                    self.silence(probe)
                    call.overdue()
                    continue
                got = call.take(kind, payload)
                if got is None:
                    continue
                if not isinstance(got, Outcome):
                    yield got
                elif reader is None:
                    return got
                else:
                    ended = got  # what it wrote is read still
                    reader.exited()
        except GeneratorExit:  # closed early: its command is dead once close() returns, as
            call.stop()  # on the local backend and the plain path (a download cut short)
            raise
        finally:
            if cmd.control is not None:
                cmd.control.unbind()
            if procutil.abandoned():  # a cancelled caller goes on once the command is dead
                call.stop()
            call.end()

    def _feed(self, call: _Call, stdin: LiveInput, probe: Probe | None) -> None:
        """A started process's input, sent as its caller writes it, then its end; stops
        once the command ended (its input then says so to the writer)."""
        try:
            for chunk in stdin_chunks(stdin):
                while not call.inbox.stdin_slot(0.25):  # the command reads none of it yet
                    if call.done or self.dead.is_set():
                        return
                    self.silence(probe)
                if call.done or self.dead.is_set():
                    return
                self.send(wire.STDIN, call.cid, chunk, waiting=lambda: self.silence(probe))
            if not call.done:
                self.send(wire.STDIN_EOF, call.cid)
        except Exception:  # the executor went away: the command's reader says why
            stdin.gone()

    async def arun(self, cmd: Command, grace: float, probe: Probe | None = None) -> AChunks:
        """`run` for an asyncio caller, without a FIFO: no thread waits for it (the frames
        come from the reader thread every command of this executor shares), and cancelling
        the awaiting task kills the command's whole tree, as closing `run` early does. Once
        the executor has been silent for SILENT seconds, the probe (an engine call) runs in
        one thread, shared by every call waiting meanwhile."""
        arrived = asyncio.Event()
        call = _Call(self, cmd, grace)
        call.inbox.wake = Waker(asyncio.get_running_loop(), arrived, call.forget)
        try:
            call.start(None)
            if cmd.stdin is not None:
                for chunk in stdin_chunks(cmd.stdin):
                    while not self.room():
                        await asyncio.sleep(0.01)
                        await self.asilence(probe)
                    self.send(wire.STDIN, call.cid, chunk)
                self.send(wire.STDIN_EOF, call.cid)
            call.arm()
            frames = call.inbox.frames
            while True:
                try:
                    kind, payload = frames.get_nowait()
                except queue.Empty:
                    arrived.clear()
                    if not frames.empty():
                        continue
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(arrived.wait(), 0.25)
                        continue
                    await self.asilence(probe)
                    call.overdue()
                    continue
                got = call.take(kind, payload)
                if got is None:
                    continue
                yield got
                if isinstance(got, Outcome):
                    return
        except (asyncio.CancelledError, GeneratorExit):  # cancelled, or left early: the
            await call.astop(arrived)  # caller goes on once the command is dead
            raise
        finally:
            call.end()


class _Call:
    """One command in flight, from the host's side: the same steps whether a thread blocks
    on it (`run`) or an asyncio task awaits it (`arun`)."""

    def __init__(self, client: ExecutorClient, cmd: Command, grace: float) -> None:
        self.cid, self.inbox = client.open_inbox()
        self.inbox.kept = cmd.keep is not None
        self.inbox.attached = cmd.attach is not None
        self.client, self.cmd, self.grace = client, cmd, grace
        self.killed = False
        self._done = [False]  # shared with the finalizer, which must not hold the call
        self.consumed = 0
        self.backstop: float | None = None
        # however the call goes (ended, or dropped unended: its event loop closed under it),
        # its command is killed and its inbox dropped, once
        kept = cmd.keep is not None
        self.forget = weakref.finalize(self, client.forget, self.cid, self._done, kept)

    @property
    def done(self) -> bool:
        """Its exit status came: nothing is left to kill."""
        return self._done[0]

    def start(self, fifo: Fifo | None) -> None:
        """Send the request (the caller then sends its stdin, and calls `arm`)."""
        client, cmd = self.client, self.cmd
        if client.dead.is_set():
            raise ExecutorLost(client.why("the executor is not running"))
        if cmd.keep is not None and cmd.attach is not None:  # a kept process, read again
            client.send(wire.ATTACH, self.cid, wire.encode_attach(cmd.keep, cmd.attach))
            return self._bind()
        request = wire.Request(
            cmd.argv,
            cmd.env,
            cmd.cwd,
            cmd.user,
            cmd.timeout,
            cmd.stdin is not None,
            stdout_fifo=fifo.inside if fifo is not None and not fifo.into else None,
            stdin_fifo=fifo.inside if fifo is not None and fifo.into else None,
            tty=list(cmd.tty) if cmd.tty is not None else None,
            keep=cmd.keep,
        )
        client.send(wire.RUN, self.cid, wire.encode_request(request))
        self._bind()

    def _bind(self) -> None:
        cmd = self.cmd
        if cmd.control is not None and cmd.keep is not None:
            # `Process.detach`: what was asked is written, then this connection ends (a
            # kept process runs on)
            cmd.control.on_detach(self.client.shutdown)
        if cmd.control is not None:  # a started process: its caller may signal it now
            resize = self.resize if cmd.tty is not None else None
            cmd.control.bind(self.signal, self._kill_now, resize)

    def resize(self, cols: int, rows: int) -> None:
        """Ask the executor to set the command's terminal's size; dropped while it reads
        nothing of what it was sent (a storm of resizes must not pile up here: the next
        one, once it reads again, carries the size that counts)."""
        if not self.done and not self.client.dead.is_set() and self.client.room():
            self.client.send(wire.RESIZE, self.cid, wire.SIZE.pack(cols, rows))

    def signal(self, sig: int) -> None:
        """Ask the executor to send `sig` to the command's process group."""
        if not self.done and not self.client.dead.is_set():
            self.client.send(wire.SIGNAL, self.cid, wire.COUNT.pack(sig))

    def arm(self) -> None:
        """Its stdin is sent: the command's own timeout counts from now."""
        if self.cmd.timeout is not None:
            self.backstop = time.monotonic() + self.cmd.timeout + self.grace + BACKSTOP

    def overdue(self) -> None:
        """Called when nothing arrived for a while: past the command's timeout (and grace)
        ask the executor once more to end it, and if it still does not, it is lost."""
        if self.backstop is None or time.monotonic() < self.backstop:
            return
        if not self.killed:  # the executor should have ended it: ask once more
            self.client.send(wire.KILL, self.cid)
            self.killed, self.backstop = True, time.monotonic() + BACKSTOP
            return
        raise ExecutorLost("executor stopped answering; it will be restarted")

    def take(self, kind: int, payload: bytes) -> tuple[StreamKind, bytes] | Outcome | None:
        """A frame of this command: output (its credit handed back as it is read), or the
        Outcome at its exit. ExecutorLost when the executor died meanwhile."""
        client = self.client
        if kind in (wire.OUT, wire.ERR):
            self.consumed += 1
            if self.consumed >= wire.WINDOW // 2:
                self.inbox.grant(self.consumed)
                client.send(wire.CREDIT, self.cid, wire.COUNT.pack(self.consumed))
                self.consumed = 0
            return ("stdout" if kind == wire.OUT else "stderr"), payload
        if kind == wire.EXIT:
            self._done[0] = True
            return client.outcome(payload)
        if kind in (wire.LOST, wire.AT) and len(payload) == wire.OFFSET.size:
            if self.cmd.control is not None:
                count = wire.OFFSET.unpack(payload)[0]
                if kind == wire.AT:
                    self.cmd.control.base = count
                else:
                    self.cmd.control.lost += count
            return None
        if kind == wire.GONE:
            self._done[0] = True
            raise ProcessNotFound(
                f"no kept process {self.cmd.keep} in this environment: it was never started "
                "there with keep=True, it ended and was forgotten, or the environment restarted"
            )
        raise ExecutorLost(client.why("the in-container executor died while it ran"))

    def end(self) -> None:
        """Whatever way the call ends: a command its caller gave up on must not outlive it."""
        self.forget()

    def _kill_now(self) -> bool:
        """Ask the executor to kill the command now; False when nothing is left to kill."""
        if self.done or self.client.dead.is_set():
            return False
        self.client.send(wire.KILL, self.cid)
        self.killed = True
        return True

    def _exited(self, wait: float) -> bool:
        """Whether the exit report came (output queued before it is dropped), waiting at most
        `wait` s for a frame."""
        try:
            kind, _ = (
                self.inbox.frames.get(timeout=wait) if wait else self.inbox.frames.get_nowait()
            )
        except queue.Empty:
            return self.done or self.client.dead.is_set()
        if kind == wire.EXIT:
            self._done[0] = True
        return self.done

    def stop(self, within: float = KILL_WITHIN) -> None:
        """Kill the command and wait (at most `within` s) for its exit report: once this
        returns, nothing of it runs on (its caller was cancelled, and must not see it act
        afterwards). A sandbox paused meanwhile never reports: the wait ends at `within`.
        A kept process is left running: it outlives its callers (its `kill` kills it)."""
        if self.cmd.keep is not None or not self._kill_now():
            return
        deadline = time.monotonic() + within
        while (left := deadline - time.monotonic()) > 0 and not self._exited(min(left, 0.25)):
            pass

    async def astop(self, arrived: asyncio.Event, within: float = KILL_WITHIN) -> None:
        """`stop`, awaited on the event loop (woken by the frames' `arrived`)."""
        if self.cmd.keep is not None or not self._kill_now():
            return
        deadline = time.monotonic() + within
        while (left := deadline - time.monotonic()) > 0:
            arrived.clear()
            if self._exited(0):
                return
            if self.inbox.frames.empty():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), min(left, 0.25))
