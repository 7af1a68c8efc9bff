"""Blocking work for asyncio callers, where no native path exists: each call gets a thread of
its own (never a shared, bounded pool: a limiter would make one sample's slow call queue
behind another's), and a call whose caller was cancelled is finished in that thread, with
what it made handed to `abandoned` (an environment a cancelled spawn started is removed)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from orchestrator import procutil
from orchestrator.sandbox.options import AChunks, Chunks
from orchestrator.sandbox.results import Outcome

T = TypeVar("T")
AHEAD = 64
"""Chunks a command run in a thread may produce before its async caller takes them."""


async def in_thread(fn: Callable[[], T], *, abandoned: Callable[[T], None] | None = None) -> T:
    """`fn()` in a new thread, awaited. Cancelling the caller does not stop `fn`; when it
    returns, its value goes to `abandoned` (in that thread) instead."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    lock = threading.Lock()
    state = {"gone": False, "handed": False}

    def settle(value: T | None, error: BaseException | None) -> None:
        if future.done():  # the caller was cancelled while this was on its way
            if error is None and abandoned is not None:
                threading.Thread(target=abandoned, args=(value,), daemon=True).start()
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)  # type: ignore[arg-type]

    def work() -> None:
        value: T | None = None
        error: BaseException | None = None
        try:
            value = fn()
        except BaseException as exc:  # handed to the caller, raised there
            error = exc
        with lock:
            gone = state["gone"]
            if not gone:
                try:
                    loop.call_soon_threadsafe(settle, value, error)
                    state["handed"] = True
                except RuntimeError:  # the loop is closed
                    gone = True
        if gone and error is None and abandoned is not None:
            abandoned(value)  # type: ignore[arg-type]

    threading.Thread(target=work, name="orch-aio", daemon=True).start()
    try:
        return await future
    except asyncio.CancelledError:
        with lock:
            state["gone"] = True
            handed = state["handed"]
        came_back = handed and future.done() and not future.cancelled()
        if came_back and abandoned is not None and future.exception() is None:
            # it came back as we were cancelled: nobody will take it
            made = future.result()
            threading.Thread(target=abandoned, args=(made,), daemon=True).start()
        raise


class _Left:
    """Whether the caller of a thread's run has left: it said so (`stop`), or its event loop
    is gone or closed (a caller that closed its loop under a silent command: no chunk will
    ever tell, and the garbage collector may find the dropped call late)."""

    def __init__(
        self, stop: threading.Event, loop: weakref.ReferenceType[asyncio.AbstractEventLoop]
    ) -> None:
        self._stop, self._loop = stop, loop

    def is_set(self) -> bool:
        if self._stop.is_set():
            return True
        running = self._loop()
        return running is None or running.is_closed()


def _stop_in(pid: int, stop: threading.Event) -> None:
    """End a call's command (its generator closed, or dropped and collected): only in the
    process that made it. A child forked meanwhile runs this at exit, and must neither touch
    the parent's command nor wait on a lock a parent thread held inside the Event."""
    if os.getpid() == pid:
        stop.set()


async def thread_chunks(make: Callable[[], Chunks]) -> AChunks:
    """A blocking command run (`make()`, a backend's `_run`) for an asyncio caller: driven by
    a thread of its own, at most AHEAD chunks ahead of the caller. When the caller stops
    early (or is cancelled), the command is killed: by procutil within about 0.05 s where
    the run pumps a process in this thread (the local backend, plain `docker exec`), else
    when the run is closed, at its next chunk or its end."""
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    room = threading.Semaphore(AHEAD)
    stop = threading.Event()

    # held weakly by the thread: a caller that drops this generator must not be kept alive
    loop_ref, items_ref = weakref.ref(loop), weakref.ref(items)

    def put(item: tuple[str, Any]) -> None:
        running, queue = loop_ref(), items_ref()
        try:
            if running is None or queue is None:
                raise RuntimeError("nobody waits")
            running.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody will read, the command must end
            stop.set()

    left = _Left(stop, loop_ref)

    def pump() -> None:
        procutil.abandon_when(left)  # a command run here dies when the caller leaves
        run = make()
        try:
            while not left.is_set():
                try:
                    chunk = next(run)
                except StopIteration as end:
                    put(("end", end.value))
                    return
                put(("chunk", chunk))
                while not room.acquire(timeout=0.25):
                    if left.is_set():
                        return
        except BaseException as exc:  # raised to the caller
            put(("error", exc))
        finally:
            run.close()

    threading.Thread(target=pump, name="orch-aio-run", daemon=True).start()
    # a caller that drops this generator unclosed (its loop closed under it) never runs the
    # `finally` below: the command must end all the same, when the frame is collected
    owner, pid = _Owner(), os.getpid()
    weakref.finalize(owner, _stop_in, pid, stop)
    try:
        while True:
            what, value = await items.get()
            if what == "chunk":
                room.release()
                yield value
            elif what == "end":
                assert isinstance(value, Outcome)
                yield value
                return
            else:
                raise value
    finally:
        _stop_in(pid, stop)


class _Owner:
    """Lives as long as a thread_chunks generator's frame does (see there)."""


class SingleFlight:
    """One blocking call shared by every async caller that asks for it while it runs (a
    probe of the engine when an executor goes silent under a thousand waiting calls: one
    `docker inspect` and one thread, not a thousand). Its value, or its error, goes to each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: concurrent.futures.Future[Any] | None = None

    async def __call__(self, fn: Callable[[], T]) -> T:
        with self._lock:
            future = self._running
            if future is None or future.done():
                future = self._running = concurrent.futures.Future()
                threading.Thread(
                    target=_settle, args=(future, fn), name="orch-aio-once", daemon=True
                ).start()
        value: T = await asyncio.wrap_future(future)
        return value


def _settle(future: concurrent.futures.Future[Any], fn: Callable[[], Any]) -> None:
    try:
        future.set_result(fn())
    except BaseException as exc:  # handed to every caller waiting on it
        future.set_exception(exc)
