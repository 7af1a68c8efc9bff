"""Blocking work for asyncio callers, where no native path exists: each call gets a thread of
its own (never a shared, bounded pool: a limiter would make one sample's slow call queue
behind another's). Two kinds:

- `in_thread`: a call whose caller was cancelled is finished in that thread, with what it
  made handed to `abandoned` (an environment a cancelled spawn started is removed);
- `stoppable`: a call whose work changes what its caller sees (files landing in a folder of
  the caller's, files written into the sandbox) is stopped when its caller is cancelled,
  and the cancel returns only once it has stopped: its command is killed, its own loops
  stop at `check_stop`, what it made is undone, and its last step (`last_step`: moving a
  download into place) never starts after the cancel. Nothing of it lands later."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
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
STOP_WITHIN = 30.0
"""Longest a cancelled call waits for its work to stop (a command killed in a sandbox that
answers slowly, a partial download removed) before the cancel goes on; then a warning is
logged (the work is told to stop all the same, and its last step is refused)."""
DONE_EVERY = 0.1
"""Seconds between the looks of a cancelled call for its thread's end (see _done): a
child forked during the call that ends through asyncio.run's cleanup takes the loop's
wakeup out of the epoll set it shares with this process (asyncio's own hazard: other waits
of this process's loop then wake only at its timers)."""
log = logging.getLogger("orchestrator")
_here = threading.local()


def _outcome(fn: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    """`fn()`'s value, or what it raised (handed to the awaiting caller, raised there)."""
    try:
        return fn(), None
    except BaseException as exc:  # handed to the caller, raised there
        return None, exc


def _hand(future: asyncio.Future[T], value: T | None, error: BaseException | None) -> bool:
    """Give a thread's outcome to the `future` its caller awaits (on the loop's thread);
    False when the future is done already (its caller was cancelled)."""
    if future.done():
        return False
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)  # type: ignore[arg-type]
    return True


async def in_thread(fn: Callable[[], T], *, abandoned: Callable[[T], None] | None = None) -> T:
    """`fn()` in a new thread, awaited. Cancelling the caller does not stop `fn`; when it
    returns, its value goes to `abandoned` (in that thread) instead."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    lock = threading.Lock()
    state = {"gone": False, "handed": False}

    def settle(value: T | None, error: BaseException | None) -> None:
        # not handed: the caller was cancelled while this was on its way
        if not _hand(future, value, error) and error is None and abandoned is not None:
            threading.Thread(target=abandoned, args=(value,), daemon=True).start()

    def work() -> None:
        value, error = _outcome(fn)
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


class Stopped(BaseException):
    """Raised inside the work of a `stoppable` call once its caller has left (it was
    cancelled): the work unwinds (past handlers of Exception, as CancelledError does),
    undoing what it made on its way out."""


class _Leave:
    """Whether the caller of a `stoppable` call has left, and whether its work has begun its
    last step: one or the other, never both (decided under a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._left = False
        self._final = False

    def is_set(self) -> bool:  # (procutil.abandon_when watches this)
        return self._left

    def leave(self) -> None:
        with self._lock:
            if not self._final:
                self._left = True

    def finish(self) -> bool:
        with self._lock:
            if not self._left:
                self._final = True
            return self._final


def check_stop() -> None:
    """Raise Stopped when the caller of the `stoppable` call this thread runs has left
    (nothing outside one)."""
    leave: _Leave | None = getattr(_here, "leave", None)
    if leave is not None and leave.is_set():
        raise Stopped("the caller was cancelled")


def last_step() -> None:
    """Called by the work of a `stoppable` call right before the step that makes its effect
    visible (a download moved into place): raises Stopped when its caller has left; else,
    from now on, a cancel waits for that step to end instead of stopping it."""
    leave: _Leave | None = getattr(_here, "leave", None)
    if leave is not None and not leave.finish():
        raise Stopped("the caller was cancelled")


async def stoppable(fn: Callable[[], T], *, within: float = STOP_WITHIN) -> T:
    """`fn()` in a new thread, awaited; cancelling the caller stops it (see the module): a
    command it runs is killed (procutil.abandon_when), `check_stop` and `last_step` raise
    Stopped in it, and the CancelledError reaches the caller once `fn` has returned or
    raised (at most `within` seconds later)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    leave = _Leave()

    def work() -> None:
        _here.leave = leave
        procutil.abandon_when(leave)
        value, error = _outcome(fn)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(_hand, future, value, error)

    threading.Thread(target=work, name="orch-aio-stoppable", daemon=True).start()
    pid = os.getpid()
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if os.getpid() != pid:  # a child forked meanwhile, at its exit: the thread is not in it
            raise
        leave.leave()
        end = loop.time() + within
        while not future.done() and loop.time() < end:  # (looked at often: see _done)
            await asyncio.wait({future}, timeout=min(DONE_EVERY, end - loop.time()))
        if not future.done():
            log.warning("a cancelled call did not stop within %g s; it was told to", within)
        elif not future.cancelled():
            future.exception()  # (retrieved: its caller left, nobody else will)
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
    when the run is closed, at its next chunk or its end; and the caller goes on only once
    that thread is done with it (at most STOP_WITHIN s), so nothing of the command runs on
    after a cancel returns."""
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
        try:
            _pump(make(), left, room, put)
        finally:
            put(("done", None))

    threading.Thread(target=pump, name="orch-aio-run", daemon=True).start()
    # a caller that drops this generator unclosed (its loop closed under it) never runs the
    # `finally` below: the command must end all the same, when the frame is collected
    owner, pid = _Owner(), os.getpid()
    weakref.finalize(owner, _stop_in, pid, stop)
    over = False
    try:
        while True:
            what, value = await items.get()
            if what == "chunk":
                room.release()
                yield value
            elif what == "end":
                over = True
                assert isinstance(value, Outcome)
                yield value
                return
            else:
                over = True
                raise value
    finally:
        _stop_in(pid, stop)
        if not over and os.getpid() == pid:  # left early: the command is dead before we go on
            try:
                await asyncio.wait_for(_done(items), STOP_WITHIN)
            except TimeoutError:
                log.warning(
                    "a cancelled call did not stop within %g s; it was told to", STOP_WITHIN
                )


def _pump(
    run: Chunks, left: _Left, room: threading.Semaphore, put: Callable[[tuple[str, Any]], None]
) -> None:
    """thread_chunks' thread: `run`'s chunks to the caller until it ends or the caller left."""
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


async def _done(items: asyncio.Queue[tuple[str, Any]]) -> None:
    """Until thread_chunks' thread says it is done (what else it sent goes unread). Looked
    at every DONE_EVERY s too, not only when the thread wakes the loop: a child forked
    during the call that ends through asyncio.run's cleanup takes the loop's wakeup out of
    the epoll set it shares with this process, and the cancel would wait out STOP_WITHIN."""
    while True:
        try:
            while True:
                if items.get_nowait()[0] == "done":
                    return
        except asyncio.QueueEmpty:
            pass
        with contextlib.suppress(TimeoutError):
            if (await asyncio.wait_for(items.get(), DONE_EVERY))[0] == "done":
                return


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

    def blocking(self, fn: Callable[[], T]) -> T:
        """The same for threads: the first caller runs `fn`, those that ask meanwhile wait
        for its value (or its error). A first caller interrupted (Ctrl-C) raises that alone:
        the others then ask on their own."""
        with self._lock:
            future = self._running
            mine = future is None or future.done()
            if mine:
                future = self._running = concurrent.futures.Future()
        assert future is not None
        if mine:
            try:
                value: T = fn()
            except BaseException as exc:
                future.set_exception(exc)
                raise
            future.set_result(value)
            return value
        try:
            got: T = future.result()
        except Exception:
            raise
        except BaseException:  # (the first caller's interruption is not theirs)
            return fn()
        return got


def _settle(future: concurrent.futures.Future[Any], fn: Callable[[], Any]) -> None:
    try:
        future.set_result(fn())
    except BaseException as exc:  # handed to every caller waiting on it
        future.set_exception(exc)
