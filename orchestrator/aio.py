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
word for word: both doors share every step but the waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, ParamSpec, overload

from orchestrator.errors import UsageError
from orchestrator.sandbox.attach import attach as attach_runtime
from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.calls import ERR_LIMIT, Sandbox, _check, _Events, _written
from orchestrator.sandbox.options import Command, output_limit_of
from orchestrator.sandbox.pool import Pool
from orchestrator.sandbox.registry import spawn_runtime
from orchestrator.sandbox.results import (
    Connection,
    Outcome,
    RuntimeInfo,
    RuntimeResult,
    StreamEvent,
)
from orchestrator.sandbox.snapshot import Snapshot
from orchestrator.sandbox.threads import in_thread, stoppable
from orchestrator.spec.loader import Environment

P = ParamSpec("P")
POOL_LOOK = 1.0
"""Longest an acquire waits for the pool's wake-up before it looks again (a bound, not the
way it learns: the pool wakes it when it offers one)."""


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

    async def execute(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
        check: bool = False,
        output_limit: int | None = None,
    ) -> RuntimeResult:
        """As Sandbox.execute."""
        sb = self.sync
        cmd = sb._command(command, env, stdin, cwd, user, timeout)
        out, err, outcome = await sb._acollect(cmd, output_limit_of(output_limit))
        result = sb._result(out, err, outcome)
        if check:
            _check(result, timeout)
        return result

    def stream(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> AsyncGenerator[StreamEvent, None]:
        """As Sandbox.stream: `async for event in rt.stream(...)`. Leaving the loop early (or
        cancelling) kills the command. Bad arguments raise here, before anything runs."""
        if stdin is not None:
            raise UsageError("stream() takes no stdin; use execute(..., stdin=...)")
        cmd = self.sync._command(command, env, None, cwd, user, timeout)
        return self._stream(cmd, output_limit_of(output_limit))

    async def _stream(self, cmd: Command, limit: int) -> AsyncGenerator[StreamEvent, None]:
        self.sync._check_usable()  # again where it is iterated (another process, a pause)
        events = _Events(self.sync, limit)
        async with contextlib.aclosing(self.sync._arun(cmd)) as run:
            async for item in run:
                if isinstance(item, Outcome):
                    for last in events.finish(item):
                        yield last
                    return
                event = events.add(*item)
                if event is not None:
                    yield event

    async def write_file(
        self,
        path: str,
        content: str | bytes,
        *,
        user: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """As Sandbox.write_file."""
        cmd, target, deadline = self.sync._write_command(path, content, user, timeout)
        _, err, outcome = await self.sync._acollect(cmd, ERR_LIMIT)
        _written(err, outcome, target, deadline)

    @overload
    async def read_file(
        self,
        path: str,
        *,
        text: Literal[True] = True,
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> str: ...
    @overload
    async def read_file(
        self,
        path: str,
        *,
        text: Literal[False],
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> bytes: ...
    @overload
    async def read_file(
        self,
        path: str,
        *,
        text: bool,
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> str | bytes: ...
    async def read_file(
        self,
        path: str,
        *,
        text: bool = True,
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> str | bytes:
        """As Sandbox.read_file."""
        read = self.sync._read_command(path, user, limit, timeout)
        out, err, outcome = await self.sync._acollect(read.cmd, read.limit + 1)
        return read.result(out, err, outcome, text)

    async def upload(
        self,
        local: str | Path,
        dest: str,
        *,
        user: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """As Sandbox.upload (in a thread: a folder's archive is bulk work). Cancelled, the
        unpacking in the sandbox is killed before the CancelledError reaches the caller:
        what it wrote by then stays, nothing more comes."""
        await stoppable(lambda: self.sync.upload(local, dest, user=user, timeout=timeout))

    async def download(
        self,
        src: str,
        local: str | Path,
        *,
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """As Sandbox.download (in a thread). Cancelled, nothing lands in `local`: the
        packing is killed and the private folder it was unpacked into removed, before the
        CancelledError reaches the caller."""
        sb = self.sync
        return await stoppable(
            lambda: sb.download(src, local, user=user, limit=limit, timeout=timeout)
        )


class AsyncRuntime(AsyncSandbox):
    """A live environment, awaited: `async with` removes it at the end, as `with` does."""

    sync: Runtime

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        self._services: dict[str, AsyncSandbox] = {}

    async def __aenter__(self) -> AsyncRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
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

    async def cleanup(self) -> None:
        await in_thread(self.sync.cleanup)

    async def kill(self) -> None:
        await in_thread(self.sync.kill)

    async def poll(self) -> int | None:
        return await in_thread(self.sync.poll)

    async def pause(self) -> None:
        await in_thread(self.sync.pause)

    async def resume(self) -> None:
        await in_thread(self.sync.resume)

    async def keep(self) -> None:
        await in_thread(self.sync.keep)

    async def detach(self) -> None:
        await in_thread(self.sync.detach)

    async def snapshot(self, dest: str | Path | None = None, **kwargs: Any) -> Snapshot:
        """As Runtime.snapshot. Cancelled, no snapshot is saved (its packing is stopped)."""
        return await stoppable(functools.partial(self.sync.snapshot, dest, **kwargs))

    async def restore(self, snap: Snapshot) -> None:
        """As Runtime.restore. Cancelled, the refilling is killed before the CancelledError
        reaches the caller (the working folder is left as it got)."""
        await stoppable(lambda: self.sync.restore(snap))

    async def suspend(self, name: str | None = None, *, keep: bool = True) -> Snapshot:
        return await in_thread(lambda: self.sync.suspend(name, keep=keep))


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
