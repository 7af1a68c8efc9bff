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
import collections
import contextlib
import functools
import json
import os
import py_compile
import queue
import select
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from orchestrator import procutil
from orchestrator.backends.container.executor import wire
from orchestrator.backends.container.layout import SANDBOX_MOUNT
from orchestrator.errors import ExecutorLost, SandboxUnavailable
from orchestrator.sandbox.options import AChunks, Chunks, Command, stdin_chunks
from orchestrator.sandbox.results import Outcome, StreamKind
from orchestrator.sandbox.threads import SingleFlight

HERE = Path(__file__).resolve().parent
AGENT = "agent.py"
#: Files copied into the sandbox folder so the executor can run inside the container, by
#: their path there: its own modules beside it, and the process core as the package
#: `procutil` (its parts import one another relatively, so it needs no `orchestrator`).
FILES = {
    **{name: HERE / name for name in (AGENT, "spawner.py", "wire.py")},
    **{
        f"procutil/{f.name}": f
        for f in sorted(Path(procutil.__file__).resolve().parent.glob("*.py"))
    },
}


@functools.cache
def executor_files() -> dict[str, bytes]:
    """What the executor's folder in a container holds, by relative path: its sources, and
    the compiled code of the modules it imports for this machine's Python
    (`__pycache__/NAME.<tag>.pyc` beside each, checked against the source's hash at
    import). That folder is read-only in the container, so Python cannot cache there itself:
    a container whose Python has this tag imports them without compiling ~50 KB of source at
    each executor start (about 45 ms of CPU); any other compiles the sources as before."""
    out = {rel: f.read_bytes() for rel, f in FILES.items()}
    tag = sys.implementation.cache_tag
    if not tag:
        return out
    with tempfile.TemporaryDirectory(prefix="orch-pyc-") as tmp:
        for rel, f in FILES.items():
            if rel == AGENT:  # run as a script: Python never loads that from a cache
                continue
            folder = rel.rpartition("/")[0]
            cached = f"{folder}/__pycache__/{f.stem}.{tag}.pyc".lstrip("/")
            cfile = Path(tmp) / cached.replace("/", "_")
            py_compile.compile(
                str(f),
                cfile=str(cfile),
                dfile=f"{SANDBOX_MOUNT}/{rel}",
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )
            out[cached] = cfile.read_bytes()
    return out


BACKSTOP = 2.0
"""Seconds past a command's own timeout (and grace) before the host asks the executor to kill
it again, and as long again before it declares the executor lost."""
KILL_WITHIN = 5.0
"""Longest a cancelled call waits for the executor to report its killed command's exit
(milliseconds, unless the sandbox is paused or overloaded meanwhile)."""
PING_AFTER = 0.5
"""Seconds without any frame from the executor before a command waiting on it sends a ping."""
SILENT = 1.5
"""Seconds without any frame (pings unanswered) before the owner's probe is asked whether the
sandbox is still there."""
SWEEP = 1.0
"""Seconds between the writer thread's looks for async calls whose event loop closed."""
OUT_BUDGET = 8 * 1024 * 1024
"""Bytes of frames queued for the executor before a caller sending stdin waits."""
STDERR_TAIL = 16
"""Chunks (of at most 4 KiB) of the executor's own stderr kept for error messages."""
Probe = Callable[[], "SandboxUnavailable | None"]


class Fifo(NamedTuple):
    """A FIFO in the folder the container shares with this machine, which the executor opens
    itself (as root: the FIFO has mode 0, so no other sandbox user can) and gives the
    command as its standard output (`into` False: `fd` is our non-blocking read end) or its
    standard input (`into` True: this machine's tar writes it; `fd` is not read here)."""

    inside: str
    fd: int
    into: bool


class _Inbox:
    """The frames of one command on their way to its caller. Holds at most what the
    executor may send: WINDOW output frames plus the credit handed back, then one EXIT."""

    def __init__(self) -> None:
        self.frames: queue.Queue[tuple[int, bytes]] = queue.Queue()
        self.wake: _Waker | None = None
        """Called (in the reader thread) after each frame queued: an async caller's waker."""
        self._lock = threading.Lock()
        self._allowed = wire.WINDOW
        self._exited = False

    def put(self, kind: int, payload: bytes) -> None:
        """Queue a frame (from the reader thread) and wake an async caller waiting on it."""
        self.frames.put((kind, payload))
        if self.wake is not None:
            self.wake()

    def grant(self, count: int) -> None:
        with self._lock:
            self._allowed += count

    def admit(self, kind: int) -> str | None:
        """None if a frame of `kind` may be queued; otherwise how it breaks the protocol."""
        with self._lock:
            if self._exited:
                return "a frame after the command's exit"
            if kind in (wire.OUT, wire.ERR):
                if self._allowed <= 0:
                    return "more output than the credit it was given"
                self._allowed -= 1
            elif kind == wire.EXIT:
                self._exited = True
            else:
                return f"a frame of unexpected kind {kind}"
        return None


class ExecutorClient:
    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self._proc: subprocess.Popen[bytes] | None = None
        self._queues: dict[int, _Inbox] = {}
        self._out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._out_bytes = 0
        self._out_cond = threading.Condition()
        self._ids = iter(range(1, 2**31))
        self._id_lock = threading.Lock()
        self._ready = threading.Event()
        self._dead = threading.Event()
        self._stderr: collections.deque[bytes] = collections.deque(maxlen=STDERR_TAIL)
        self._fault = ""  # how the executor broke the protocol, once it did
        self.info: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []
        self._last_rx = time.monotonic()
        self._last_ping = 0.0
        self._probe_once = SingleFlight()
        """The probe async callers share while it runs (see _asilence)."""
        self._pid = os.getpid()
        """The process that talks to the executor: a child forked from it sends nothing."""

    # ----- process -------------------------------------------------------------------------
    def start(self) -> None:
        self._last_rx = time.monotonic()
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
        )
        self._threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
            threading.Thread(target=self._write, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def wait_ready(self, timeout: float) -> bool:
        """True once the executor said READY; False if it died or did not answer in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ready.wait(0.01):
                return True
            if self._dead.is_set():
                return False
        return self._ready.is_set()

    @property
    def alive(self) -> bool:
        return self._proc is not None and not self._dead.is_set()

    @property
    def stderr_tail(self) -> str:
        return b"".join(self._stderr).decode("utf-8", "replace").strip()

    def shutdown(self) -> None:
        """Ask the executor to stop (it kills what still runs and exits); do not wait. Its
        input ends once the frames queued before are written."""
        self._out.put(None)

    def close(self, release: bool = True) -> None:
        """Stop the executor and wait for it. With `release`, tell it first that this is on
        purpose, so that an executor started with --owned does not stop the sandbox."""
        proc = self._proc
        if proc is None:
            return
        if release and not self._dead.is_set():
            self._send(wire.RELEASE, 0)
        self.shutdown()
        try:
            proc.wait(2)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        for t in self._threads:
            t.join(2)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        self._dead.set()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        stream = self._proc.stdout
        if self._greeting(stream):
            try:
                self._frames(stream)
            except wire.BadFrame as exc:
                self._fault = str(exc)
            if self._fault:  # not ours any more: it is stopped, its commands fail
                with contextlib.suppress(OSError):
                    self._proc.kill()
        self._dead.set()
        for inbox in list(self._queues.values()):
            inbox.put(-1, b"")

    def _greeting(self, stream: Any) -> bool:
        """Read the READY frame. Anything else is the docker CLI explaining why the executor
        could not start (it prints that on stdout): keep it for the error message."""
        head = stream.read(wire.HEADER.size)
        if len(head) == wire.HEADER.size:
            kind, _, size = wire.HEADER.unpack(head)
            if kind == wire.READY and size < 4096:
                with contextlib.suppress(ValueError):
                    info = json.loads(stream.read(size).decode())
                    if isinstance(info, dict):
                        self.info = info
                        self._ready.set()
                        return True
        self._stderr.append(head + stream.read(4096))
        return False

    def _frames(self, stream: Any) -> None:
        """Hand each frame to its command; never blocks. Until the protocol is broken (see
        the module), or the stream ends."""
        while not self._fault:
            frame = wire.read_frame(stream, limit=procutil.CHUNK)
            if frame is None:
                return
            kind, cid, payload = frame
            self._last_rx = time.monotonic()
            if kind == wire.PONG:
                continue
            inbox = self._queues.get(cid)
            if inbox is None:
                continue  # a command nobody listens to any more: dropped
            broke = inbox.admit(kind)
            if broke is not None:
                self._fault = f"it sent {broke} (command {cid})"
            else:
                inbox.put(kind, payload)

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        while chunk := self._proc.stderr.read(4096):
            self._stderr.append(chunk)

    def _write(self) -> None:
        """The only writer of the executor's input. A sandbox that stops reading (paused,
        frozen) blocks this thread, never a caller."""
        assert self._proc is not None and self._proc.stdin is not None
        stdin = self._proc.stdin
        swept = time.monotonic()
        while True:
            try:
                frame = self._out.get(timeout=SWEEP)
            except queue.Empty:
                frame = b""
            if time.monotonic() - swept >= SWEEP:  # however busy the executor is
                self._sweep()
                swept = time.monotonic()
            if frame is None:
                break
            if not frame:
                continue
            # on a broken pipe the reader notices the death and fails the commands
            with contextlib.suppress(OSError, ValueError):
                stdin.write(frame)
            with self._out_cond:
                self._out_bytes -= len(frame)
                self._out_cond.notify_all()
        with contextlib.suppress(OSError):
            stdin.close()

    def _sweep(self) -> None:
        """Forget every async call whose event loop is gone or closed (its command killed):
        a caller that closed its loop under a silent command is not waited for until the
        garbage collector finds the dropped call."""
        for inbox in list(self._queues.values()):
            if inbox.wake is not None:
                inbox.wake.check()

    def _send(
        self, kind: int, cid: int, payload: bytes = b"", waiting: Callable[[], None] | None = None
    ) -> None:
        """Queue a frame for the writer. With `waiting` (stdin data), wait while more than
        OUT_BUDGET bytes are queued, calling it every 0.25 s (it may raise)."""
        frame = wire.pack(kind, cid, payload)
        while True:
            with self._out_cond:
                full = self._out_bytes > OUT_BUDGET and not self._dead.is_set()
                if not full or waiting is None:
                    self._out_bytes += len(frame)
                    break
                self._out_cond.wait(0.25)
            waiting()
        self._out.put(frame)

    # ----- commands ------------------------------------------------------------------------
    def _quiet(self) -> bool:
        """Called while a command waits with nothing arriving: ping the executor; True when
        even pings go unanswered, and the owner's probe should say whether the sandbox is
        still there (then `_probed`)."""
        now = time.monotonic()
        quiet = now - self._last_rx
        if quiet >= PING_AFTER and now - self._last_ping >= PING_AFTER:
            self._last_ping = now
            self._send(wire.PING, 0)
        return quiet >= SILENT

    def _probed(self, lost: SandboxUnavailable | None) -> None:
        """What the probe said: raise it, or (the sandbox runs) give the executor time."""
        if lost is not None:
            raise lost
        self._last_rx = time.monotonic()

    def _silence(self, probe: Probe | None) -> None:
        if self._quiet() and probe is not None:
            self._probed(probe())

    def _room(self) -> bool:
        """Whether a frame of stdin may be queued now (see OUT_BUDGET)."""
        with self._out_cond:
            return self._out_bytes <= OUT_BUDGET or self._dead.is_set()

    @property
    def ready_now(self) -> bool:
        """Whether it greeted and runs: a command can go to it without waiting."""
        return self._ready.is_set() and self.alive

    def run(
        self, cmd: Command, grace: float, probe: Probe | None = None, fifo: Fifo | None = None
    ) -> Chunks:
        """Run one command through the executor. `fifo`: its output (or input) goes through
        that FIFO instead (see Fifo). Output read from it comes as "stdout" chunks, as it
        arrives, and after the command exits until the FIFO's end of file, DRAIN seconds of
        quiet or DRAIN_MAX seconds in all (time the caller holds a chunk not counted), even
        if bytes keep trickling in: a sandbox process may hold it open and write."""
        call = _Call(self, cmd, grace)
        try:
            call.start(fifo)
            if cmd.stdin is not None:
                for chunk in stdin_chunks(cmd.stdin):
                    if procutil.abandoned():  # its caller left while it was fed
                        return Outcome(137, False, 0.0)
                    self._send(wire.STDIN, call.cid, chunk, waiting=lambda: self._silence(probe))
                self._send(wire.STDIN_EOF, call.cid)
            call.arm()
            reader = _FifoReader(fifo.fd) if fifo is not None and not fifo.into else None
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
                    self._silence(probe)
                    call.overdue()
                    continue
                got = call.take(kind, payload)
                if not isinstance(got, Outcome):
                    yield got
                elif reader is None:
                    return got
                else:
                    ended = got  # what it wrote is read still
                    reader.exited()
        finally:
            if procutil.abandoned():  # a cancelled caller goes on once the command is dead
                call.stop()
            call.end()

    async def arun(self, cmd: Command, grace: float, probe: Probe | None = None) -> AChunks:
        """`run` for an asyncio caller, without a FIFO: no thread waits for it (the frames
        come from the reader thread every command of this executor shares), and cancelling
        the awaiting task kills the command's whole tree, as closing `run` early does. Once
        the executor has been silent for SILENT seconds, the probe (an engine call) runs in
        one thread, shared by every call waiting meanwhile."""
        arrived = asyncio.Event()
        call = _Call(self, cmd, grace)
        call.inbox.wake = _Waker(asyncio.get_running_loop(), arrived, call.forget)
        try:
            call.start(None)
            if cmd.stdin is not None:
                for chunk in stdin_chunks(cmd.stdin):
                    while not self._room():
                        await asyncio.sleep(0.01)
                        await self._asilence(probe)
                    self._send(wire.STDIN, call.cid, chunk)
                self._send(wire.STDIN_EOF, call.cid)
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
                    await self._asilence(probe)
                    call.overdue()
                    continue
                got = call.take(kind, payload)
                yield got
                if isinstance(got, Outcome):
                    return
        except (asyncio.CancelledError, GeneratorExit):  # cancelled, or left early: the
            await call.astop(arrived)  # caller goes on once the command is dead
            raise
        finally:
            call.end()

    async def _asilence(self, probe: Probe | None) -> None:
        if self._quiet() and probe is not None:
            self._probed(await self._probe_once(probe))

    def _why(self, what: str) -> str:
        """Why this executor cannot go on, for ExecutorLost: `what` happened, or the way it
        broke the protocol."""
        if self._fault:
            return (
                f"the in-container executor broke the protocol: {self._fault}; it does not "
                "behave as ours (a root sandbox may have replaced python3) and was stopped. "
                "The command failed; the next one starts a new executor"
            )
        tail = self.stderr_tail
        return what + (f": {tail}" if tail else "")

    def _outcome(self, payload: bytes) -> Outcome:
        try:
            end = wire.decode_exit(payload)
        except (ValueError, TypeError) as exc:
            self._fault = f"an exit report that is not one ({exc})"
            if self._proc is not None:
                with contextlib.suppress(OSError):
                    self._proc.kill()
            raise ExecutorLost(self._why("")) from None
        return _outcome(end)


class _Call:
    """One command in flight, from the host's side: the same steps whether a thread blocks
    on it (`run`) or an asyncio task awaits it (`arun`)."""

    def __init__(self, client: ExecutorClient, cmd: Command, grace: float) -> None:
        with client._id_lock:
            self.cid = next(client._ids)
        self.client, self.cmd, self.grace = client, cmd, grace
        self.inbox = client._queues[self.cid] = _Inbox()
        self.killed = False
        self._done = [False]  # shared with the finalizer, which must not hold the call
        self.consumed = 0
        self.backstop: float | None = None
        # however the call goes (ended, or dropped unended: its event loop closed under it),
        # its command is killed and its inbox dropped, once
        self.forget = weakref.finalize(self, _forget, client, self.cid, self._done)

    @property
    def done(self) -> bool:
        """Its exit status came: nothing is left to kill."""
        return self._done[0]

    def start(self, fifo: Fifo | None) -> None:
        """Send the request (the caller then sends its stdin, and calls `arm`)."""
        client, cmd = self.client, self.cmd
        if client._dead.is_set():
            raise ExecutorLost(client._why("the executor is not running"))
        request = wire.Request(
            cmd.argv,
            cmd.env,
            cmd.cwd,
            cmd.user,
            cmd.timeout,
            cmd.stdin is not None,
            stdout_fifo=fifo.inside if fifo is not None and not fifo.into else None,
            stdin_fifo=fifo.inside if fifo is not None and fifo.into else None,
        )
        client._send(wire.RUN, self.cid, wire.encode_request(request))

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
            self.client._send(wire.KILL, self.cid)
            self.killed, self.backstop = True, time.monotonic() + BACKSTOP
            return
        raise ExecutorLost("executor stopped answering; it will be restarted")

    def take(self, kind: int, payload: bytes) -> tuple[StreamKind, bytes] | Outcome:
        """A frame of this command: output (its credit handed back as it is read), or the
        Outcome at its exit. ExecutorLost when the executor died meanwhile."""
        client = self.client
        if kind in (wire.OUT, wire.ERR):
            self.consumed += 1
            if self.consumed >= wire.WINDOW // 2:
                self.inbox.grant(self.consumed)
                client._send(wire.CREDIT, self.cid, wire.COUNT.pack(self.consumed))
                self.consumed = 0
            return ("stdout" if kind == wire.OUT else "stderr"), payload
        if kind == wire.EXIT:
            self._done[0] = True
            return client._outcome(payload)
        raise ExecutorLost(client._why("the in-container executor died while it ran"))

    def end(self) -> None:
        """Whatever way the call ends: a command its caller gave up on must not outlive it."""
        self.forget()

    def _kill_now(self) -> bool:
        """Ask the executor to kill the command now; False when nothing is left to kill."""
        if self.done or self.client._dead.is_set():
            return False
        self.client._send(wire.KILL, self.cid)
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
            return self.done or self.client._dead.is_set()
        if kind == wire.EXIT:
            self._done[0] = True
        return self.done

    def stop(self, within: float = KILL_WITHIN) -> None:
        """Kill the command and wait (at most `within` s) for its exit report: once this
        returns, nothing of it runs on (its caller was cancelled, and must not see it act
        afterwards). A sandbox paused meanwhile never reports: the wait ends at `within`."""
        if not self._kill_now():
            return
        deadline = time.monotonic() + within
        while (left := deadline - time.monotonic()) > 0 and not self._exited(min(left, 0.25)):
            pass

    async def astop(self, arrived: asyncio.Event, within: float = KILL_WITHIN) -> None:
        """`stop`, awaited on the event loop (woken by the frames' `arrived`)."""
        if not self._kill_now():
            return
        deadline = time.monotonic() + within
        while (left := deadline - time.monotonic()) > 0:
            arrived.clear()
            if self._exited(0):
                return
            if self.inbox.frames.empty():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), min(left, 0.25))


class _Waker:
    """What the reader thread calls for each frame of an async call: sets `arrived` on its
    loop. It holds the loop and the event weakly (the executor lives on; a call its caller
    dropped must not), and once either is gone, or the loop is closed, nobody will read:
    the call is forgotten (its command killed). The writer thread `check`s it every SWEEP
    seconds, so a silent command dies with its loop too."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, arrived: asyncio.Event, forget: Callable[[], object]
    ) -> None:
        self._loop, self._event = weakref.ref(loop), weakref.ref(arrived)
        self._forget = forget

    def __call__(self) -> None:
        running, event = self._loop(), self._event()
        if running is None or event is None:
            self._forget()
            return
        try:
            running.call_soon_threadsafe(event.set)
        except RuntimeError:  # the loop is closed
            self._forget()

    def check(self) -> None:
        running = self._loop()
        if running is None or running.is_closed() or self._event() is None:
            self._forget()


def _forget(client: ExecutorClient, cid: int, done: list[bool]) -> None:
    """A call is over: unless its command exited, it is killed; its inbox goes. In a child
    forked while the call ran (its finalizers run at its exit) nothing is done: the command
    is the parent's, and a lock a parent thread held at the fork stays held in the child."""
    if os.getpid() != client._pid:
        return
    if not done[0] and not client._dead.is_set():
        client._send(wire.KILL, cid)
    client._queues.pop(cid, None)


class _FifoReader:
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


def _outcome(end: wire.Exit) -> Outcome:
    if end.unavailable:
        raise SandboxUnavailable(
            f"the sandbox cannot run the command: {end.unavailable} (its pids or memory "
            "limit is reached; the command did not start)"
        )
    return Outcome(end.exit_code, end.timed_out, end.elapsed, end.oom_killed)
