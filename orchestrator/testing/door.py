"""The suite's second front door: a runtime whose every call the suite makes goes through the
asyncio API (`orchestrator.aio`), awaited on an event loop of its own in another thread, and
is answered to the suite as the blocking API would. One suite, two doors: a rule the async
API breaks fails the same check the blocking API passes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Coroutine, Generator, Iterator
from typing import Any, TypeVar, cast

from orchestrator import Runtime, RuntimeResult, StreamEvent
from orchestrator.aio import AsyncProcess, AsyncRuntime, AsyncSandbox

T = TypeVar("T")
DIRECT = frozenset({"workdir", "default_user", "static_path", "connection", "info", "env"})
"""What both doors answer alike without waiting: passed to the blocking object."""


class _Loop:
    """One event loop in a daemon thread, for every door's calls (as an application has
    one loop for all its sandboxes)."""

    _shared: _Loop | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="door-loop", daemon=True).start()

    @classmethod
    def shared(cls) -> _Loop:
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


class SandboxDoor:
    """A Sandbox's calls through an AsyncSandbox."""

    def __init__(self, inner: AsyncSandbox, loop: _Loop) -> None:
        self._inner, self._loop = inner, loop

    def __getattr__(self, name: str) -> Any:
        if name in DIRECT:
            return getattr(self._inner.sync, name)
        awaited = getattr(self._inner, name, None)
        if awaited is None or not callable(awaited):
            return getattr(self._inner.sync, name)
        if name == "stream":
            return self._stream
        if name == "start":
            return lambda *a, **k: ProcessDoor(self._loop.run(awaited(*a, **k)), self._loop)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run(awaited(*args, **kwargs))

        return call

    def _stream(self, *args: Any, **kwargs: Any) -> Generator[StreamEvent, None, None]:
        events = self._inner.stream(*args, **kwargs)  # bad arguments raise here, as stream's
        return _driven(self._loop, events)


def _driven(
    loop: _Loop, events: AsyncGenerator[StreamEvent, None]
) -> Generator[StreamEvent, None, None]:
    """An async generator's events, each awaited on the door's loop; left early, it is
    closed there (a stream's command is killed)."""
    try:
        while True:
            try:
                yield loop.run(events.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run(events.aclose())


class ProcessDoor:
    """A started process's calls through an AsyncProcess, answered as Process answers."""

    def __init__(self, inner: AsyncProcess, loop: _Loop) -> None:
        self._inner, self._loop = inner, loop

    @property
    def ended(self) -> bool:
        return self._inner.ended

    def read(self, timeout: float | None = None) -> StreamEvent | None:
        return self._loop.run(self._inner.read(timeout))

    def __iter__(self) -> Iterator[StreamEvent]:
        return _driven(self._loop, self._inner.__aiter__())

    def wait(self, timeout: float | None = None) -> RuntimeResult:
        return self._loop.run(self._inner.wait(timeout))

    def write(self, data: str | bytes, *, timeout: float | None = None) -> None:
        self._loop.run(self._inner.write(data, timeout=timeout))

    def offer(self, data: str | bytes) -> bool:
        return self._inner.sync.offer(data)

    def close_stdin(self) -> None:
        self._loop.run(self._inner.close_stdin())

    def signal(self, sig: int) -> None:
        self._loop.run(self._inner.signal(sig))

    def kill(self) -> None:
        self._loop.run(self._inner.kill())

    def resize(self, cols: int, rows: int) -> None:
        self._loop.run(self._inner.resize(cols, rows))

    @property
    def tty(self) -> bool:
        return self._inner.tty

    def __enter__(self) -> ProcessDoor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.run(self._inner.__aexit__())


class RuntimeDoor(SandboxDoor):
    """A Runtime's calls through an AsyncRuntime (a `with` block removes it, as Runtime's)."""

    _inner: AsyncRuntime

    def __init__(self, inner: AsyncRuntime, loop: _Loop) -> None:
        super().__init__(inner, loop)

    def __enter__(self) -> RuntimeDoor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def service(self, name: str) -> SandboxDoor:
        return SandboxDoor(self._inner.service(name), self._loop)

    def fork(self, n: int = 1, **options: Any) -> list[RuntimeDoor]:
        made = self._loop.run(self._inner.fork(n, **options))
        return [RuntimeDoor(copy, self._loop) for copy in made]

    def cleanup(self) -> None:
        self._loop.run(self._inner.cleanup())


def through_async(spawn: Any) -> Runtime:
    """Spawn through orchestrator.aio.spawn (`spawn`: an awaitable's maker taking nothing),
    and hand back the door, typed as the Runtime the suite expects."""
    loop = _Loop.shared()
    return cast(Runtime, RuntimeDoor(loop.run(spawn()), loop))
