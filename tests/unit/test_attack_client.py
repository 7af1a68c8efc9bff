"""A hostile executor. The executor is the image's own python3, which a root sandbox can
replace; its stand-in here (a script on this machine, started by ExecutorClient as the real
one is) ignores the protocol. The host must stay bounded: it never queues more than a
command's credit allows, never allocates what a frame header claims, and fails the command
(ExecutorLost) instead of waiting."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.backends.container.executor.client import ExecutorClient
from orchestrator.errors import ExecutorLost
from orchestrator.sandbox.options import Command

# READY, then (once the first command's RUN came) `SEND`, then silence with the pipe open
STAND_IN = """
import json, struct, sys, time
H = struct.Struct(">BII")
out, inp = sys.stdout.buffer, sys.stdin.buffer
info = json.dumps({"setuid": True, "pid": 1}).encode()
out.write(H.pack(10, 0, len(info)) + info)
out.flush()
kind, cid, size = H.unpack(inp.read(9))
inp.read(size)
%s
out.flush()
time.sleep(120)
"""
FLOOD = "frame = H.pack(11, cid, 1024) + b'x' * 1024\nfor _ in range(%d): out.write(frame)"
CLAIM = "out.write(H.pack(11, cid, %d))"
BOUND = 10.0


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[list[ExecutorClient]]:
    clients: list[ExecutorClient] = []
    yield clients
    for client in clients:
        client.close()


def _start(tmp_path: Path, send: str, clients: list[ExecutorClient]) -> ExecutorClient:
    script = tmp_path / "python3"
    script.write_text(STAND_IN % send)
    client = ExecutorClient([sys.executable, "-I", str(script)])
    clients.append(client)
    client.start()
    assert client.wait_ready(10)
    return client


def _consume(client: ExecutorClient, pause: float) -> tuple[BaseException | None, int, float]:
    """Read a command's output slowly, for at most BOUND seconds: (what it raised, chunks
    read, peak bytes allocated meanwhile)."""
    result: list[BaseException | None] = [None]
    got = [0]
    cmd = Command(["true"], {}, "/", None, None, None)

    def consume() -> None:
        chunks = client.run(cmd, 0.5)
        try:
            for _ in chunks:
                got[0] += 1
                time.sleep(pause)
        except BaseException as exc:
            result[0] = exc
        finally:
            chunks.close()

    tracemalloc.start()
    try:
        worker = threading.Thread(target=consume, daemon=True)
        worker.start()
        worker.join(BOUND)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not worker.is_alive(), f"the command did not fail within {BOUND} s ({got[0]} read)"
    return result[0], got[0], peak


def test_an_executor_that_ignores_credit_is_stopped_before_memory_grows(
    tmp_path: Path, stand_in: list[ExecutorClient]
) -> None:
    """50,000 output frames sent at once, against a consumer reading one every 5 ms."""
    client = _start(tmp_path, FLOOD % 50_000, stand_in)
    raised, read, peak = _consume(client, 0.005)
    assert isinstance(raised, ExecutorLost), raised
    assert "more output than the credit" in str(raised) and "replaced python3" in str(raised)
    assert read <= 64  # the window, and no more
    assert peak < 8 << 20, f"{peak} bytes allocated while the executor flooded"
    assert not client.alive


@pytest.mark.parametrize("claimed", [60 << 20, 2**32 - 1])
def test_a_frame_header_claiming_a_huge_payload_allocates_nothing(
    tmp_path: Path, stand_in: list[ExecutorClient], claimed: int
) -> None:
    client = _start(tmp_path, CLAIM % claimed, stand_in)
    raised, _, peak = _consume(client, 0.0)
    assert isinstance(raised, ExecutorLost), raised
    assert peak < 8 << 20, f"{peak} bytes allocated for a frame that never came"


_FORK_WHILE_HELD = """
import os, sys, threading, time
held, release = threading.Event(), threading.Event()

def hold(lock):
    with lock:  # a parent thread inside the call's machinery at the moment of the fork
        held.set()
        release.wait(60)

def fork_and_wait(lock):
    threading.Thread(target=hold, args=(lock,), daemon=True).start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # its finalizers run now, the call's among them
    deadline = time.monotonic() + 10
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            release.set()
            sys.exit("the child hung at exit on the parent's call")
        time.sleep(0.05)
    release.set()
"""

_EXECUTOR_CALL = """
from orchestrator.backends.container.executor.client import ExecutorClient, _Call
from orchestrator.sandbox.options import Command

client = ExecutorClient(["true"])
call = _Call(client, Command(["true"], {}, "/", None, None, None), 1.0)
fork_and_wait(client._out_cond)  # the executor's send lock
"""

_ASYNC_CALL = """
import asyncio, weakref
from orchestrator.sandbox.threads import thread_chunks

def chunks():
    yield ("stdout", b"one")
    time.sleep(3)  # running at the fork (which holds no lock of its own: aclose waits)
    yield ("stdout", b"two")

async def main():
    calls = thread_chunks(chunks)
    await calls.__anext__()
    [stop] = [  # the Event the call's finalizer sets to end its command
        arg
        for info in (f.peek() for f in list(weakref.finalize._registry))
        if info is not None
        for arg in (getattr(info[1], "__self__", None), *info[2])
        if isinstance(arg, threading.Event)
    ]
    fork_and_wait(stop._cond)
    began = time.monotonic()
    await calls.aclose()  # (the child's exit took the loop's wakeup out of their shared epoll)
    if time.monotonic() - began > 15:
        sys.exit("the cancel waited for its whole STOP_WITHIN, not for the command's end")

asyncio.run(main())
"""


_STOPPABLE_CALL = """
import asyncio
from orchestrator.sandbox.threads import check_stop, stoppable

def work():
    for _ in range(600):
        time.sleep(0.05)
        check_stop()

async def main():
    task = asyncio.ensure_future(stoppable(work))
    await asyncio.sleep(0.2)
    fork_and_wait(threading.Lock())  # (the child's exit cancels its copy of the call)
    began = time.monotonic()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    if time.monotonic() - began > 15:
        sys.exit("the cancel waited for its whole STOP_WITHIN, not for the call's end")

asyncio.run(main())
"""


@pytest.mark.parametrize(
    "call", [_EXECUTOR_CALL, _ASYNC_CALL, _STOPPABLE_CALL], ids=["executor", "async", "stoppable"]
)
def test_a_child_forked_while_a_call_runs_exits_without_touching_it(call: str) -> None:
    """A call's finalizer ends its command (through the executor, or the thread that runs
    an async call). In a forked child it must do nothing: the command is the parent's, and
    a lock a parent thread held at the fork would hold the child's exit forever."""
    done = subprocess.run(
        [sys.executable, "-c", _FORK_WHILE_HELD + call],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
