"""Host side of the executor: one long-lived `docker exec -i` per environment, speaking the
framed protocol of `wire`. Many commands may be in flight at once; if the executor dies,
commands in flight get ExecutorLost and the owner starts a new one for the next command."""

from __future__ import annotations

import collections
import contextlib
import json
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.errors import ExecutorLost
from orchestrator.runtime.executor import wire
from orchestrator.runtime.options import Chunks, Command
from orchestrator.runtime.results import Outcome

HERE = Path(__file__).resolve().parent
#: Files copied into the sandbox folder so the executor can run inside the container.
FILES = (HERE / "agent.py", HERE / "wire.py", HERE.parent / "procutil.py")
QUEUE_FRAMES = 256
"""Frames (each at most 64 KiB of output) buffered per command before backpressure."""
BACKSTOP = 5.0
"""Seconds past a command's own timeout (and grace) before the host stops waiting for the
executor and declares it lost."""


class ExecutorClient:
    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self._proc: subprocess.Popen[bytes] | None = None
        self._queues: dict[int, queue.Queue[tuple[int, bytes]]] = {}
        self._write_lock = threading.Lock()
        self._ids = iter(range(1, 2**31))
        self._id_lock = threading.Lock()
        self._ready = threading.Event()
        self._dead = threading.Event()
        self._stderr: collections.deque[bytes] = collections.deque(maxlen=50)
        self.info: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []

    # ----- process -------------------------------------------------------------------------
    def start(self) -> None:
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
        """Ask the executor to stop (it kills what still runs and exits); do not wait."""
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def close(self) -> None:
        proc = self._proc
        if proc is None:
            return
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
            self._frames(stream)
        self._dead.set()
        for cid in list(self._queues):
            self._deliver(cid, -1, b"")

    def _greeting(self, stream: Any) -> bool:
        """Read the READY frame. Anything else is the docker CLI explaining why the executor
        could not start (it prints that on stdout): keep it for the error message."""
        head = stream.read(wire.HEADER.size)
        if len(head) == wire.HEADER.size:
            kind, _, size = wire.HEADER.unpack(head)
            if kind == wire.READY and size < 4096:
                self.info = json.loads(stream.read(size).decode())
                self._ready.set()
                return True
        self._stderr.append(head + stream.read(4096))
        return False

    def _frames(self, stream: Any) -> None:
        while True:
            frame = wire.read_frame(stream)
            if frame is None:
                break
            kind, cid, payload = frame
            self._deliver(cid, kind, payload)

    def _deliver(self, cid: int, kind: int, payload: bytes) -> None:
        """Hand a frame to its command. The queue is bounded, so a slow consumer slows the
        executor down instead of piling output up in memory; a command nobody listens to
        any more is dropped."""
        while True:
            q = self._queues.get(cid)
            if q is None:
                return
            try:
                q.put((kind, payload), timeout=0.1)
                return
            except queue.Full:
                continue

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)

    def _send(self, kind: int, cid: int, payload: bytes = b"") -> None:
        assert self._proc is not None and self._proc.stdin is not None
        # on a broken pipe the reader notices the death and fails the command
        with self._write_lock, contextlib.suppress(BrokenPipeError, OSError, ValueError):
            self._proc.stdin.write(wire.pack(kind, cid, payload))

    # ----- commands ------------------------------------------------------------------------
    def run(self, cmd: Command, grace: float) -> Chunks:
        with self._id_lock:
            cid = next(self._ids)
        q: queue.Queue[tuple[int, bytes]] = queue.Queue(maxsize=QUEUE_FRAMES)
        self._queues[cid] = q
        request = {
            "argv": cmd.argv,
            "env": cmd.env,
            "cwd": cmd.cwd,
            "user": cmd.user,
            "timeout": cmd.timeout,
            "stdin": cmd.stdin is not None,
        }
        done = False
        try:
            if self._dead.is_set():
                raise ExecutorLost(f"executor is not running: {self.stderr_tail}")
            self._send(wire.RUN, cid, json.dumps(request).encode())
            if cmd.stdin is not None:
                view = memoryview(cmd.stdin)
                for i in range(0, len(view), 1 << 20):
                    self._send(wire.STDIN, cid, bytes(view[i : i + (1 << 20)]))
                self._send(wire.STDIN_EOF, cid)
            backstop = (
                time.monotonic() + cmd.timeout + grace + BACKSTOP
                if cmd.timeout is not None
                else None
            )
            killed = False
            while True:
                wait = None if backstop is None else max(0.05, backstop - time.monotonic())
                try:
                    kind, payload = q.get(timeout=wait)
                except queue.Empty:
                    if not killed:  # the executor should have ended it: ask once more
                        self._send(wire.KILL, cid)
                        killed, backstop = True, time.monotonic() + BACKSTOP
                        continue
                    raise ExecutorLost("executor stopped answering; it will be restarted") from None
                if kind == wire.OUT:
                    yield "stdout", payload
                elif kind == wire.ERR:
                    yield "stderr", payload
                elif kind == wire.EXIT:
                    done = True
                    info = json.loads(payload.decode())
                    return Outcome(
                        info["exit_code"],
                        info["timed_out"],
                        info["elapsed"],
                        bool(info.get("oom_killed")),
                    )
                else:
                    raise ExecutorLost(
                        "the in-container executor died while the command ran"
                        + (f": {self.stderr_tail}" if self.stderr_tail else "")
                    )
        finally:
            if not done and not self._dead.is_set():
                self._send(wire.KILL, cid)  # caller gave up: the command must not outlive it
            self._queues.pop(cid, None)
