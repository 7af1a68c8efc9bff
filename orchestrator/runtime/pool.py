"""A warm pool: environments of one file kept up and set up before anyone asks, so that
handing one out costs a queue pop instead of a start.

    with Pool("env.yaml", size=4) as pool:
        rt = pool.acquire()          # at once when one is ready; a replacement starts
        try:
            rt.execute(...)
        finally:
            pool.release(rt)         # removed (the pool never hands one out twice)

Thread-safe. Environments in the pool belong to this process like any other (the guardian
removes them if it dies); close() removes those still waiting and waits for starts in flight.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchestratorError, RuntimeClosed, UsageError
from orchestrator.runtime.base import Runtime
from orchestrator.spec.loader import Environment, load_environment


class Pool:
    def __init__(self, env: Environment | str | Path, size: int, **spawn: Any) -> None:
        """Keep `size` environments of `env` ready; `spawn` is passed on to spawn_runtime
        (workspace excepted: each environment gets a private one)."""
        if size < 1:
            raise UsageError(f"a pool needs a size of at least 1, got {size}")
        if "workspace" in spawn:
            raise UsageError("pooled environments cannot share a workspace; each has its own")
        from orchestrator.runtime.registry import spawn_runtime

        self.env = env if isinstance(env, Environment) else load_environment(env)
        self.size = size
        self._spawn: Callable[[], Runtime] = lambda: spawn_runtime(self.env, **spawn)
        self._ready: queue.Queue[Runtime | OrchestratorError] = queue.Queue()
        self._starts = ThreadPoolExecutor(max_workers=size, thread_name_prefix="orch-pool")
        self._lock = threading.Lock()
        self._pending = 0
        self._closed = False
        for _ in range(size):
            self._refill()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def ready(self) -> int:
        """Environments waiting to be handed out."""
        return self._ready.qsize()

    def _refill(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._pending += 1
        self._starts.submit(self._start_one)

    def _start_one(self) -> None:
        try:
            item: Runtime | OrchestratorError = self._spawn()
        except OrchestratorError as exc:  # handed to the next acquire(), which raises it
            item = exc
        with self._lock:
            self._pending -= 1
            closed = self._closed
        if closed and isinstance(item, Runtime):
            item.cleanup()
            return
        self._ready.put(item)

    def acquire(self, timeout: float | None = None) -> Runtime:
        """An environment, set up and running; a replacement starts in the background.
        Waits up to `timeout` seconds when none is ready (TimeoutError after); a start that
        failed raises its error here."""
        with self._lock:
            if self._closed:
                raise RuntimeClosed("the pool is closed")
        try:
            item = self._ready.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no environment became ready within {timeout:g}s") from None
        self._refill()
        if isinstance(item, OrchestratorError):
            raise item
        return item

    def release(self, rt: Runtime) -> None:
        """Give an environment back: it is removed (what ran in it stays there)."""
        rt.cleanup()

    def close(self) -> None:
        """Remove every environment still in the pool, after the starts in flight end."""
        with self._lock:
            self._closed = True
        self._starts.shutdown(wait=True)
        while True:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Runtime):
                item.cleanup()
