"""The asyncio front door: the same runtimes, awaited.

    from orchestrator import aio

    async with await aio.spawn("env.yaml") as rt:
        result = await rt.execute("pytest -q", timeout=600)
        async for event in rt.stream("make"):
            print(event.text, end="")
        await rt.write_file("notes.txt", "hi")
        text = await rt.read_file("notes.txt")

Commands and files (`execute`, `stream`, `read_file`, `write_file`) take the executor's own
channel where the backend has one (the Docker backend's in-container executor): the call
waits on the event loop, not in a thread, so a thousand calls in flight cost no thread
each. Cancelling the task awaiting a call kills the command's whole process tree in the
sandbox, and the sandbox stays usable; the CancelledError reaches the caller once the
executor has reported the command dead (at most a few seconds: a paused sandbox reports
nothing). Elsewhere (the local backend, plain `docker exec`, an executor still starting)
the blocking call runs in a thread of its own, never queued behind a bounded pool; a
cancelled one is killed (within about 0.05 s where that thread pumps a process), and the
cancel returns once that thread is done with it.

Folder transfers, snapshot and restore run in a thread of their own too, and are stopped
when the awaiting task is cancelled: their command is killed and what they half made is
undone before the CancelledError reaches the caller, so nothing of them lands afterwards.
Lifecycle calls (spawn, attach, cleanup, suspend, pools) are engine work that takes seconds:
each runs in a thread of its own (`in_thread`, which a caller may use for any other
blocking call of this package) and runs to its end. A spawn cancelled while it starts
removes the environment once it is up. Results, errors and limits are the blocking API's,
word for word: each call is described once (sandbox/call.py: its command, its checks, how
its output becomes the answer) and both doors drive that description, differing only in
how they wait; every door here is made from its blocking twin, with its signature and docs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.call import Call, Streamed, as_door_of
from orchestrator.sandbox.calls import Sandbox
from orchestrator.sandbox.process import Process
from orchestrator.sandbox.results import Connection, RuntimeInfo, RuntimeResult, StreamEvent
from orchestrator.sandbox.threads import in_thread, stoppable
from orchestrator.services.attach import attach as attach_runtime
from orchestrator.services.pool import Pool
from orchestrator.services.spawn import spawn_runtime
from orchestrator.services.suspend import fork as fork_runtime
from orchestrator.spec.loader import Environment

P = ParamSpec("P")
T = TypeVar("T")
Awaited = Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]
"""A door of this module: the blocking call's arguments, its answer awaited."""
POOL_LOOK = 1.0
"""Longest an acquire waits for the pool's wake-up before it looks again (a bound, not the
way it learns: the pool wakes it when it offers one)."""
STOPPED = (
    "Awaited, in a thread of its own: cancelled, its command is killed and what it half made "
    "undone before the CancelledError reaches the caller; nothing of it lands afterwards."
)
THREADED = "Awaited, in a thread of its own; cancelled, it still runs to its end."


def native(describe: Callable[Concatenate[Sandbox, P], Call[T]]) -> Awaited[P, T]:
    """The awaited door of a described call (`Sandbox.execute_call`, ...): the blocking
    door's very steps, its command run through the backend's `_arun`."""

    async def door(self: AsyncSandbox, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.sync.aperform(describe(self.sync, *args, **kwargs))

    return as_door_of(door, describe)


def native_stream(
    describe: Callable[Concatenate[Sandbox, P], Streamed],
) -> Callable[Concatenate[Any, P], AsyncGenerator[StreamEvent, None]]:
    """The awaited door of `stream`: `async for event in rt.stream(...)`; leaving the loop
    early (or cancelling) kills the command. Bad arguments raise at the call."""

    def door(
        self: AsyncSandbox, /, *args: P.args, **kwargs: P.kwargs
    ) -> AsyncGenerator[StreamEvent, None]:
        return self.sync.aevents(describe(self.sync, *args, **kwargs))

    return as_door_of(door, describe)


def threaded(blocking: Callable[Concatenate[Any, P], T], *, stop: bool) -> Awaited[P, T]:
    """The awaited door of a blocking call run in a thread of its own: `stoppable` (stopped
    when its caller is cancelled) with `stop`, else `in_thread` (run to its end)."""

    async def door(self: AsyncSandbox, /, *args: P.args, **kwargs: P.kwargs) -> T:
        call = functools.partial(blocking, self.sync, *args, **kwargs)
        return await (stoppable(call) if stop else in_thread(call))

    return as_door_of(door, blocking, STOPPED if stop else THREADED)


PROCESS_NOTE = (
    "Awaited: an AsyncProcess. Its events come to `async for` without a thread waiting on "
    "them; a write waits on the event loop while the process has not read what came before."
)
TICK = 0.01
"""How often an awaited write looks again while the process reads none of its input."""


class AsyncProcess:
    """A started process (sandbox/process.py), awaited: `await write(...)`, `async for
    event in process`, `await wait()`. Leaving `async with` kills it unless it ended."""

    def __init__(self, process: Process) -> None:
        self.sync = process
        """The blocking object behind it."""
        self._arrived = asyncio.Event()
        process.watch(functools.partial(_set_soon, asyncio.get_running_loop(), self._arrived))

    @property
    def ended(self) -> bool:
        return self.sync.ended

    @property
    def id(self) -> str | None:
        """A kept process's id (Process.id)."""
        return self.sync.id

    @property
    def cursor(self) -> int:
        """As Process.cursor."""
        return self.sync.cursor

    def detach(self) -> None:
        """As Process.detach: a kept process runs on."""
        self.sync.detach()

    async def read(self, timeout: float | None = None) -> StreamEvent | None:
        """As Process.read: the next event, None when none came within `timeout` s."""
        return await self._first(lambda: self.sync.read(0), timeout)

    async def _first(self, look: Callable[[], T | None], timeout: float | None) -> T | None:
        """What `look` finds, looked at again each time the process's pump wakes us; None
        when it found nothing within `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._arrived.clear()
            found = look()
            if found is not None:
                return found
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    def __aiter__(self) -> AsyncGenerator[StreamEvent, None]:
        return self._events()

    async def _events(self) -> AsyncGenerator[StreamEvent, None]:
        while True:
            event = await self.read()
            assert event is not None
            yield event
            if event.kind == "finished":
                return

    async def wait(self, timeout: float | None = None) -> RuntimeResult:
        """As Process.wait, awaited: the events nobody read are dropped while it waits."""
        with self.sync.draining():
            if await self._first(lambda: self.sync.ended or None, timeout) is None:
                raise TimeoutError(f"the process did not end within {timeout:g}s")
        return self.sync.wait(0)

    async def write(self, data: str | bytes, *, timeout: float | None = None) -> None:
        """As Process.write, waiting on the event loop while the process has not read what
        came before (at most `timeout` s: TimeoutError)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.sync.offer(data):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the process read none of its input for {timeout:g}s")
            await asyncio.sleep(TICK)

    async def close_stdin(self) -> None:
        await in_thread(self.sync.close_stdin)

    async def signal(self, sig: int) -> None:
        """As Process.signal (in a thread: a backend may need an engine call for it)."""
        await in_thread(lambda: self.sync.signal(sig))

    async def kill(self) -> None:
        await in_thread(self.sync.kill)

    async def resize(self, cols: int, rows: int) -> None:
        """As Process.resize (a frame to the executor, or an ioctl: it does not wait)."""
        self.sync.resize(cols, rows)

    @property
    def tty(self) -> bool:
        return self.sync.tty

    async def __aenter__(self) -> AsyncProcess:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await in_thread(lambda: self.sync.__exit__(None, None, None))


def _set_soon(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    """Set `event` on its loop (from another thread); nothing once the loop closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(event.set)


def _removed(rt: Runtime) -> None:
    """What becomes of an environment whose spawning task was cancelled: removed."""
    with contextlib.suppress(Exception):
        rt.cleanup()


class AsyncSandbox:
    """Commands and files in one place (the main sandbox or a service), awaited."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sync = sandbox
        """The blocking object behind it."""

    @property
    def workdir(self) -> str:
        return self.sync.workdir

    @property
    def default_user(self) -> str | None:
        return self.sync.default_user

    def static_path(self, name: str) -> str:
        return self.sync.static_path(name)

    def connection(self, *, user: str | None = None) -> Connection:
        return self.sync.connection(user=user)

    async def start(self, *args: Any, **kwargs: Any) -> AsyncProcess:
        if kwargs.get("tty"):  # (whether it can have one may start the executor: a thread)
            return AsyncProcess(await in_thread(lambda: self.sync.start(*args, **kwargs)))
        return AsyncProcess(self.sync.start(*args, **kwargs))

    start = as_door_of(start, Sandbox.start, PROCESS_NOTE)

    async def process(self, *args: Any, **kwargs: Any) -> AsyncProcess:
        return AsyncProcess(self.sync.process(*args, **kwargs))

    process = as_door_of(process, Sandbox.process, PROCESS_NOTE)
    execute = native(Sandbox.execute_call)
    stream = native_stream(Sandbox.stream_call)
    write_file = native(Sandbox.write_file_call)
    read_file = native(Sandbox.read_file_call)
    upload = threaded(Sandbox.upload, stop=True)
    download = threaded(Sandbox.download, stop=True)


class AsyncRuntime(AsyncSandbox):
    """A live environment, awaited: `async with` removes it at the end, as `with` does (and
    leaves one found by `attach` running, as `with` does)."""

    sync: Runtime

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        self._services: dict[str, AsyncSandbox] = {}

    async def __aenter__(self) -> AsyncRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.sync.attached:
            await self.detach()
        else:
            await self.cleanup()

    @property
    def env(self) -> Environment:
        return self.sync.env

    @property
    def closed(self) -> bool:
        return self.sync.closed

    def info(self) -> RuntimeInfo:
        return self.sync.info()

    def service(self, name: str) -> AsyncSandbox:
        """A service of the environment (as Runtime.service)."""
        if name not in self._services:
            self._services[name] = AsyncSandbox(self.sync.service(name))
        return self._services[name]

    cleanup = threaded(Runtime.cleanup, stop=False)
    kill = threaded(Runtime.kill, stop=False)
    poll = threaded(Runtime.poll, stop=False)
    pause = threaded(Runtime.pause, stop=False)
    resume = threaded(Runtime.resume, stop=False)
    keep = threaded(Runtime.keep, stop=False)
    detach = threaded(Runtime.detach, stop=False)
    snapshot = threaded(Runtime.snapshot, stop=True)
    restore = threaded(Runtime.restore, stop=True)
    suspend = threaded(Runtime.suspend, stop=False)
    checkpoint = threaded(Runtime.checkpoint, stop=False)
    usage = threaded(Runtime.usage, stop=False)
    set_egress = threaded(Runtime.set_egress, stop=False)

    async def fork(
        self, n: int = 1, *, detached: bool = False, memory: bool | None = None
    ) -> list[AsyncRuntime]:
        """As orchestrator.fork(rt, n), awaited. Cancelled meanwhile, the copies it made go."""
        made = await in_thread(
            lambda: fork_runtime(self.sync, n, detached=detached, memory=memory),
            abandoned=_all_removed,
        )
        return [AsyncRuntime(rt) for rt in made]


def _all_removed(made: list[Runtime]) -> None:
    for rt in made:
        _removed(rt)


def _awaited(
    name: str, fn: Callable[P, Runtime], abandoned: Callable[[Runtime], None] | None = None
) -> Callable[P, Coroutine[Any, Any, AsyncRuntime]]:
    """The async twin of a call that makes a Runtime, with its very signature."""

    @functools.wraps(fn)
    async def twin(*args: P.args, **kwargs: P.kwargs) -> AsyncRuntime:
        return AsyncRuntime(await in_thread(lambda: fn(*args, **kwargs), abandoned=abandoned))

    twin.__name__ = twin.__qualname__ = name
    return twin


spawn = _awaited("spawn", spawn_runtime, _removed)
"""As spawn_runtime (the same arguments), awaited. Cancelled while it starts, the
environment is removed once up, in the background."""
attach = _awaited("attach", attach_runtime)
"""As orchestrator.attach, awaited."""


class AsyncPool:
    """A warm pool (orchestrator.Pool), awaited: `acquire` takes a ready environment at once
    and waits on the event loop while none is; `release` removes (or resets) it."""

    def __init__(self, pool: Pool) -> None:
        self.sync = pool

    @classmethod
    async def start(
        cls,
        env: Environment | str | Path,
        size: int,
        *,
        reuse: bool = False,
        total: int | None = None,
        **spawn: Any,
    ) -> AsyncPool:
        """A pool of `size` (as Pool(...)); its environments start in the background."""
        return cls(await in_thread(lambda: Pool(env, size, reuse=reuse, total=total, **spawn)))

    async def __aenter__(self) -> AsyncPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def acquire(self, timeout: float | None = None) -> AsyncRuntime:
        """As Pool.acquire: TimeoutError after `timeout` s with none ready, PoolExhausted past
        its total. Waits on the event
        loop, woken by the pool when it offers one; taking it (a file written in its project
        folder) runs in a thread."""
        pool, loop, offered = self.sync, asyncio.get_running_loop(), asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(offered.set)

        stop = pool.watch(wake)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                offered.clear()
                if pool.offered or pool.closed or pool.exhausted:
                    try:
                        taken = await in_thread(
                            lambda: pool.acquire(timeout=0), abandoned=pool.release
                        )
                        return AsyncRuntime(taken)
                    except TimeoutError:  # another caller took it first
                        continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no environment became ready within {timeout:g}s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(offered.wait(), min(left or POOL_LOOK, POOL_LOOK))
        finally:
            stop()

    async def release(self, rt: AsyncRuntime, *, reset: bool | None = None) -> None:
        await in_thread(lambda: self.sync.release(rt.sync, reset=reset))

    async def close(self) -> None:
        await in_thread(self.sync.close)


__all__ = ["AsyncPool", "AsyncRuntime", "AsyncSandbox", "attach", "in_thread", "spawn"]
