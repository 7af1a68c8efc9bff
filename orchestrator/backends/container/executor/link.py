"""The link to one in-container executor: its `docker exec -i` process, the reader thread
that hands each frame to its command's inbox (held to the protocol: see the client's
module), the single writer of its input, and the pings and probes that tell a silent
executor from a gone sandbox. What a command does over the link is the client's."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import queue
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import procutil
from orchestrator.backends.container.executor import direct, wire
from orchestrator.errors import ExecutorLost, SandboxUnavailable
from orchestrator.sandbox.results import Outcome
from orchestrator.sandbox.threads import SingleFlight

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
MEETING = direct.MEET_WITHIN + direct.SWITCH_WITHIN + 1
"""Seconds a socket meeting under way may take, both its steps (waited out before a
greeted executor is given up on, or sent RELEASE)."""
Probe = Callable[[], "SandboxUnavailable | None"]


class Inbox:
    """The frames of one command on their way to its caller. Holds at most what the
    executor may send: WINDOW output frames plus the credit handed back, then one EXIT."""

    def __init__(self) -> None:
        self.frames: queue.SimpleQueue[tuple[int, bytes]] = queue.SimpleQueue()  # (C: quicker)
        self.wake: Waker | None = None
        """Called (in the reader thread) after each frame queued: an async caller's waker."""
        self._lock = threading.Lock()
        self._allowed = wire.WINDOW
        self._exited = False
        self._stdin_cond = threading.Condition()
        self._stdin_ahead = 0  # STDIN frames sent that the executor has not said it took
        self.kept = False
        """A kept process's call (client.py): it also takes GONE as its first frame (AT too
        when it `attached`), and one LOST before each output frame; any other call takes
        none of them."""
        self.attached = False
        self._first = True
        self._lost = False

    def put(self, kind: int, payload: bytes) -> None:
        """Queue a frame (from the reader thread) and wake an async caller waiting on it."""
        self.frames.put((kind, payload))
        if self.wake is not None:
            self.wake()

    def grant(self, count: int) -> None:
        with self._lock:
            self._allowed += count

    def stdin_slot(self, wait: float) -> bool:
        """Take a place for one more STDIN frame (at most STDIN_WINDOW ahead of what the
        command took), waiting at most `wait` s: False when none came."""
        with self._stdin_cond:
            if not self._stdin_cond.wait_for(lambda: self._stdin_ahead < wire.STDIN_WINDOW, wait):
                return False
            self._stdin_ahead += 1
            return True

    def taken(self, payload: bytes) -> str | None:
        """The executor wrote STDIN frames to the command: None, or how it broke the
        protocol (a frame of the wrong size). A hostile executor saying more than it took
        only gets more of its own command's input sooner."""
        if len(payload) != wire.COUNT.size:
            return "a TAKEN frame of the wrong size"
        with self._stdin_cond:
            count = wire.COUNT.unpack(payload)[0]
            # (a bytes stdin is not paced: its frames are sent, and said taken, beyond this)
            self._stdin_ahead = max(0, self._stdin_ahead - count)
            self._stdin_cond.notify_all()
        return None

    def admit(self, kind: int) -> str | None:
        """None if a frame of `kind` may be queued; otherwise how it breaks the protocol."""
        with self._lock:
            if self._exited:
                return "a frame after the command's exit"
            first, self._first = self._first, False
            if kind in (wire.OUT, wire.ERR):
                if self._allowed <= 0:
                    return "more output than the credit it was given"
                self._allowed -= 1
                self._lost = False
            elif kind == wire.EXIT:
                self._exited = True
            elif kind == wire.LOST and self.kept and not self._lost:
                self._lost = True  # (held to one before the next output: never piling up)
            elif kind == wire.GONE and self.kept and first:
                self._exited = True
            elif kind == wire.AT and self.kept and self.attached and first:
                pass
            else:
                return f"a frame of unexpected kind {kind}"
        return None


class Waker:
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


class Link:
    """One executor process and the threads that carry its frames (see the module)."""

    def __init__(
        self, argv: list[str], direct: tuple[Path, str] | None = None, *, owned: bool = False
    ) -> None:
        self.argv = argv
        self._owned = owned
        """An executor started with --owned: told OWN as soon as its greeting is taken, so
        that from then on the end of its input stops the sandbox; one the host gave up on
        before (closed while its greeting was late) stops nothing, whatever the close lost
        of its input."""
        self._greet_lock = threading.Lock()
        self._taken = False
        """Its greeting was taken (and OWN sent, where owned): from then on the host never
        gives up on it for lateness (`greeted_late` waits out its meeting), one decision
        under `_greet_lock` with the give-up."""
        self._direct = direct
        """The host folder the container alone sees, and its path there: where the frames
        may move onto a socket once the executor greeted (see direct.py)."""
        self.transport = "pipes"
        """What carries the frames: "socket", or "pipes" (with why, when a socket was tried)."""
        self._sock: socket.socket | None = None
        self._sock_reader: Any = None
        self._closing = False
        self._sink: Callable[[bytes], object] | None = None
        self._met = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._queues: dict[int, Inbox] = {}
        self._out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._out_bytes = 0
        self._out_cond = threading.Condition()
        self._ids = iter(range(1, 2**31))
        self._id_lock = threading.Lock()
        self._ready = threading.Event()
        self.dead = threading.Event()
        """Set once the executor is gone (or stopped for breaking the protocol)."""
        self._stderr: collections.deque[bytes] = collections.deque(maxlen=STDERR_TAIL)
        self._fault = ""  # how the executor broke the protocol, once it did
        self.info: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []
        self._last_rx = time.monotonic()
        self._last_ping = 0.0
        self._probe_once = SingleFlight()
        """The probe async callers share while it runs (see asilence)."""
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
            env=procutil.marked_environ(),  # ended by our guardian if we die first
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
            if self.dead.is_set():
                return False
        return self._ready.is_set()

    def greeted_late(self) -> bool:
        """After `wait_ready` said no: True when the greeting was taken meanwhile and its
        meeting ended on a working link (waited for, bounded); else the host gives up on
        it now, and a greeting that comes later is never taken (no OWN: its end of input,
        when the close has killed its `docker exec` with RELEASE unsent, stops nothing)."""
        with self._greet_lock:
            if not self._taken:
                self._closing = True
                return False
        self._met.wait(MEETING)
        return self._ready.is_set()

    @property
    def alive(self) -> bool:
        return self._proc is not None and not self.dead.is_set()

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
        with self._greet_lock:  # no greeting is taken, and no meeting starts, from now on
            self._closing = True
            taken = self._taken
        if release and not self.dead.is_set():
            # RELEASE must go the way the executor reads: after a meeting under way (each
            # of its two steps bounded: MEET_WITHIN, SWITCH_WITHIN); none is, where no
            # greeting was taken (an executor that never greeted is not waited for)
            if taken:
                self._met.wait(MEETING)
            self.send(wire.RELEASE, 0)
        self.shutdown()
        try:
            proc.wait(2)
        except (OSError, subprocess.TimeoutExpired):
            self._hang_up()
            proc.wait()
        if self._sock is not None:  # whatever holds it (an executor's stand-in that forked)
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            t.join(2)
        for pipe in (proc.stdout, proc.stderr, self._sock_reader, self._sock):
            if pipe is not None:
                pipe.close()
        self.dead.set()

    def _hang_up(self) -> None:
        """End the executor's input and ours, whichever way its frames go: it ends (killing
        its commands), and the reader sees the end."""
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def _input(self) -> Any:
        """Where the executor's first frame (its greeting) is read from."""
        assert self._proc is not None and self._proc.stdout is not None
        return self._proc.stdout

    def _read(self) -> None:
        stream: Any = self._input()
        try:
            try:
                greeted = self._greeting(stream)
            except OSError:  # a connection reset before any frame (a dying resident)
                greeted = False
            if greeted:
                with self._greet_lock:
                    if not self._closing:
                        self._taken = True
                        if self._owned:
                            self.send(wire.OWN, 0)  # (before DIRECT: on the pipes, read first)
                stream = self._meet(stream)
                self._met.set()
                if stream is not None:
                    self._ready.set()
                    try:
                        self._frames(stream)
                    except wire.BadFrame as exc:
                        self._fault = str(exc)
                    except (OSError, ValueError):  # a reset connection: its end
                        pass
                if self._fault:  # not ours any more: it is stopped, its commands fail
                    self._hang_up()
        finally:  # however the reading ends, every command hears of it
            self._met.set()
            self.dead.set()
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
                        return True
        self._stderr.append(head + stream.read(4096))
        return False

    def _meet(self, pipe: Any) -> Any:
        """Move the frames onto a socket where this container can reach one (direct.py):
        the stream to read frames from, or None (the executor ended, or broke the protocol)."""
        if self._direct is None or self.info.get("direct") is not True or self._closing:
            return pipe
        try:
            meeting = direct.Meeting(*self._direct)
        except OSError as exc:
            self.transport = f"pipes (no socket here: {exc})"
            return pipe
        try:
            self.send(wire.DIRECT, 0, meeting.ask())
            got = meeting.meet(pipe)
        except (direct.Broken, wire.BadFrame) as exc:
            self._fault = str(exc)
            return None
        except (OSError, ValueError) as exc:  # which way it reads now cannot be told
            self._fault = f"the move onto its socket failed ({exc})"
            return None
        finally:
            meeting.close()
        if got is None:
            return None
        if isinstance(got, str):
            self.transport = f"pipes (the executor cannot reach its socket: {got})"
            return pipe
        self._sock, self._sink, self.transport = got, got.sendall, "socket"
        self._sock_reader = got.makefile("rb")
        return self._sock_reader

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
            if kind == wire.TAKEN:  # stdin credit: for the feeder, never queued
                broke = inbox.taken(payload)
                if broke is None:
                    continue
            else:
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
        stdin = self._proc.stdin if self._proc is not None else None
        write = self._sink or (stdin.write if stdin is not None else None)
        assert write is not None
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
                (self._sink or write)(frame)
            with self._out_cond:
                self._out_bytes -= len(frame)
                self._out_cond.notify_all()
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.close()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)

    def _sweep(self) -> None:
        """Forget every async call whose event loop is gone or closed (its command killed):
        a caller that closed its loop under a silent command is not waited for until the
        garbage collector finds the dropped call."""
        for inbox in list(self._queues.values()):
            if inbox.wake is not None:
                inbox.wake.check()

    def send(
        self, kind: int, cid: int, payload: bytes = b"", waiting: Callable[[], None] | None = None
    ) -> None:
        """Queue a frame for the writer. With `waiting` (stdin data), wait while more than
        OUT_BUDGET bytes are queued, calling it every 0.25 s (it may raise)."""
        frame = wire.pack(kind, cid, payload)
        while True:
            with self._out_cond:
                full = self._out_bytes > OUT_BUDGET and not self.dead.is_set()
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
            self.send(wire.PING, 0)
        return quiet >= SILENT

    def _probed(self, lost: SandboxUnavailable | None) -> None:
        """What the probe said: raise it, or (the sandbox runs) give the executor time."""
        if lost is not None:
            raise lost
        self._last_rx = time.monotonic()

    def silence(self, probe: Probe | None) -> None:
        """Called while a command waits with nothing arriving: ping, and once even pings go
        unanswered, ask the owner's probe (SandboxUnavailable when the sandbox is gone)."""
        if self._quiet() and probe is not None:
            self._probed(probe())

    def room(self) -> bool:
        """Whether a frame of stdin may be queued now (see OUT_BUDGET)."""
        with self._out_cond:
            return self._out_bytes <= OUT_BUDGET or self.dead.is_set()

    @property
    def ready_now(self) -> bool:
        """Whether it greeted and runs: a command can go to it without waiting."""
        return self._ready.is_set() and self.alive

    def open_inbox(self) -> tuple[int, Inbox]:
        """A new command's id, and the inbox its frames will be handed to."""
        with self._id_lock:
            cid = next(self._ids)
        inbox = self._queues[cid] = Inbox()
        return cid, inbox

    def forget(self, cid: int, done: list[bool], kept: bool = False) -> None:
        """A call is over: unless its command exited (or is `kept`: it outlives its
        callers), it is killed; its inbox goes. In a child
        forked while the call ran (its finalizers run at its exit) nothing is done: the command
        is the parent's, and a lock a parent thread held at the fork stays held in the child."""
        if os.getpid() != self._pid:
            return
        if not done[0] and not kept and not self.dead.is_set():
            self.send(wire.KILL, cid)
        self._queues.pop(cid, None)

    async def asilence(self, probe: Probe | None) -> None:
        """`silence` for an asyncio caller: the probe runs in one thread, shared by every
        call waiting meanwhile."""
        if self._quiet() and probe is not None:
            self._probed(await self._probe_once(probe))

    def why(self, what: str) -> str:
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

    def outcome(self, payload: bytes) -> Outcome:
        """A command's exit report as its Outcome; one that is not a report breaks the
        protocol (the executor is stopped, ExecutorLost)."""
        try:
            end = wire.decode_exit(payload)
        except (ValueError, TypeError) as exc:
            self._fault = f"an exit report that is not one ({exc})"
            self._hang_up()
            raise ExecutorLost(self.why("")) from None
        return exit_outcome(end)


def exit_outcome(end: wire.Exit) -> Outcome:
    if end.unavailable:
        raise SandboxUnavailable(
            f"the sandbox cannot run the command: {end.unavailable} (its pids or memory "
            "limit is reached; the command did not start)"
        )
    return Outcome(end.exit_code, end.timed_out, end.elapsed, end.oom_killed)
