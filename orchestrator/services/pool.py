"""A warm pool: environments of one file kept up and set up before anyone asks, so that
handing one out costs a queue pop instead of a start.

    with Pool("env.yaml", size=4) as pool:
        rt = pool.acquire()          # at once when one is ready; a replacement starts
        try:
            rt.execute(...)
        finally:
            pool.release(rt)         # removed; release(rt, reset=True) puts it back instead

Two ways to run one:
- disposable (the default): `size` environments wait; each acquire() starts a replacement
  and release() removes what it gets back. Nothing one caller did is seen by the next.
- reuse=True: the pool holds `size` environments in all; release() resets one (every
  process in it killed, the workspace put back as it was after setup) and hands it to the
  next acquire(), which waits while all are out. Cheaper, but a reset restores only the
  workspace: files elsewhere in the container, and the services, stay as they were.

Thread-safe and bounded. Environments in the pool belong to this process like any other (the
guardian removes them if it dies); close() removes those waiting and waits for the starts in
flight. The pool asks each environment only public hooks of the runtime (`baseline`, `reset`,
`pool_enter`, `pool_move`, `pool_state`): a container backend records there, in each
member's project folder, which pool it is in and whether it waits or is in use (`orchestrator
ps` shows it); another process may claim a waiting one (`orchestrator up --pool`), and
sweep() lets the pool notice and replace it.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.errors import OrchestratorError, PoolExhausted, RuntimeClosed, UsageError
from orchestrator.sandbox.base import Runtime
from orchestrator.services.attach import attach, attachable
from orchestrator.services.spawn import spawn_runtime
from orchestrator.spec.loader import Environment, load_environment

log = logging.getLogger("orchestrator.pool")


class Pool:
    def __init__(
        self,
        env: Environment | str | Path,
        size: int,
        *,
        reuse: bool = False,
        total: int | None = None,
        **spawn: Any,
    ) -> None:
        """Keep `size` environments of `env` ready; `spawn` is passed on to spawn_runtime
        (workspace excepted: each environment gets a private one). With `total` (a
        disposable pool), start no more than that many in all: a batch of known size gets
        none started for nothing at its end; past it, acquire() raises PoolExhausted."""
        if size < 1:
            raise UsageError(f"a pool needs a size of at least 1, got {size}")
        if total is not None and (total < 1 or reuse):
            raise UsageError(
                f"a pool's total must be at least 1, got {total}"
                if total is not None and total < 1
                else "total bounds a disposable pool's starts; a reuse pool starts `size` once"
            )
        if "workspace" in spawn:
            raise UsageError("pooled environments cannot share a workspace; each has its own")
        self.env = env if isinstance(env, Environment) else load_environment(env)
        self.size = size
        self.reuse = reuse
        self.id = uuid.uuid4().hex[:8]
        self._spawn: Callable[[], Runtime] = lambda: spawn_runtime(self.env, **spawn)
        self._ready: collections.deque[Runtime | OrchestratorError] = collections.deque()
        self._baselines: dict[Runtime, bytes | None] = {}
        """Every environment of the pool (waiting or out): its workspace after setup."""
        self._starts = ThreadPoolExecutor(max_workers=size, thread_name_prefix="orch-pool")
        self._cond = threading.Condition()
        self._pending = 0
        self._left = total
        """Starts the pool may still make (None: no bound)."""
        self._closed = False
        self._pid = os.getpid()
        """The process the pool belongs to: a forked child's copy neither hands out nor
        removes its environments."""
        self._watchers: set[Callable[[], None]] = set()
        """Called (in the pool's threads) when something is offered or the pool closes."""
        for _ in range(size):
            self._refill()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def ready(self) -> int:
        """Environments waiting to be handed out."""
        with self._cond:
            return sum(isinstance(item, Runtime) for item in self._ready)

    @property
    def offered(self) -> int:
        """Environments waiting, and failed starts (acquire() raises those): what acquire()
        would take at once."""
        with self._cond:
            return len(self._ready)

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def watch(self, watcher: Callable[[], None]) -> Callable[[], None]:
        """Call `watcher()` (in whatever thread offers) each time an environment or a failed
        start is offered, and when the pool closes: a waiter that cannot block on the pool
        (an asyncio task) is woken instead of polling. Returns what stops it."""
        with self._cond:
            self._watchers.add(watcher)

        def stop() -> None:
            with self._cond:
                self._watchers.discard(watcher)

        return stop

    @property
    def starting(self) -> int:
        """Environments being started."""
        with self._cond:
            return self._pending

    @property
    def in_use(self) -> int:
        """Environments handed out and not released yet."""
        with self._cond:
            return len(self._baselines) - sum(isinstance(i, Runtime) for i in self._ready)

    # ----- filling -------------------------------------------------------------------------
    @property
    def exhausted(self) -> bool:
        """Whether acquire() would raise PoolExhausted: every start `total` allowed made,
        none ready or starting."""
        with self._cond:
            return self._exhausted()

    def _exhausted(self) -> bool:
        return self._left == 0 and not self._ready and not self._pending

    def _refill(self) -> None:
        with self._cond:
            if self._closed or self._left == 0:
                return
            if self._left is not None:
                self._left -= 1
            self._pending += 1
        self._starts.submit(self._start_one)

    def _start_one(self) -> None:
        item: Runtime | OrchestratorError
        try:
            item = self._spawn()
        except OrchestratorError as exc:  # handed to the next acquire(), which raises it
            item = exc
        baseline = None
        if isinstance(item, Runtime):
            try:
                baseline = item.baseline()
            except OrchestratorError as exc:  # it can still be handed out, not reset
                log.warning("pool %s: %s cannot be reset: %s", self.id, self.env.name, exc)
        with self._cond:
            self._pending -= 1
            if isinstance(item, Runtime):
                self._baselines[item] = baseline
            elif self._left is not None:
                self._left += 1  # a failed start hands nothing out: its replacement may start
        self._offer(item)

    def _offer(self, item: Runtime | OrchestratorError) -> None:
        """Put an environment (or a failed start) where acquire() finds it; a closed pool
        removes it instead."""
        if isinstance(item, Runtime):
            item.pool_enter(self.id)
        with self._cond:
            if not self._closed:
                self._ready.append(item)
                self._cond.notify()
                watchers = list(self._watchers)
            else:
                watchers = None
        if watchers is not None:
            for watcher in watchers:
                watcher()
            return
        if isinstance(item, Runtime):
            self._discard(item)

    def _discard(self, rt: Runtime) -> None:
        with self._cond:
            self._baselines.pop(rt, None)
        rt.cleanup()

    # ----- handing out ---------------------------------------------------------------------
    def acquire(self, timeout: float | None = None) -> Runtime:
        """An environment, set up and running. Waits up to `timeout` seconds when none is
        ready (TimeoutError after); a start that failed raises its error here; PoolExhausted
        when `total` environments were started and none is left."""
        self._check_owner()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                while not self._ready and not self._closed:
                    if self._exhausted():
                        raise PoolExhausted(
                            f"the pool of {self.env.name} started all the environments its "
                            "total allows; start one with spawn_runtime"
                        )
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"no environment became ready within {timeout:g}s")
                    self._cond.wait(left)
                if self._closed:
                    raise RuntimeClosed("the pool is closed")
                item = self._ready.popleft()
            if not self.reuse or not isinstance(item, Runtime):
                self._refill()  # a failed start is replaced in either mode
            if not isinstance(item, Runtime):
                raise item
            if item.pool_move("ready", "in-use"):
                return item
            self._let_go(item)  # claimed by another process meanwhile: try the next

    def release(self, rt: Runtime, *, reset: bool | None = None) -> None:
        """Give an environment back. With reset (the default of a reuse pool) its processes
        are killed, its workspace is put back as it was after setup, and it waits for the
        next acquire(); otherwise, or when that fails, it is removed."""
        self._check_owner()
        with self._cond:
            if rt not in self._baselines:
                raise UsageError(f"{rt.env.name}: not an environment of this pool")
            baseline = self._baselines[rt]
            wanted = not self._closed and (self.reuse or self.ready + self._pending < self.size)
        if reset is None:
            reset = self.reuse
        if reset and wanted and baseline is not None and not rt.closed:
            try:
                rt.reset(baseline)
            except OrchestratorError as exc:
                log.warning("pool %s: reset failed, removing it: %s", self.id, exc)
            else:
                self._offer(rt)
                return
        self._discard(rt)
        if self.reuse:
            self._refill()

    def sweep(self) -> int:
        """Drop the waiting environments another process claimed (`orchestrator up --pool`)
        and start one in place of each; returns how many. A start that failed meanwhile is
        raised here (and replaced), as acquire() would."""
        self._check_owner()
        with self._cond:
            failed = next((i for i in self._ready if not isinstance(i, Runtime)), None)
            if failed is not None:
                self._ready.remove(failed)
            waiting = [item for item in self._ready if isinstance(item, Runtime)]
        if failed is not None:
            self._refill()
            raise failed
        taken = [rt for rt in waiting if rt.pool_state() == "claimed"]
        with self._cond:
            for rt in taken:
                self._ready.remove(rt)
        for rt in taken:
            self._let_go(rt)
            self._refill()
        return len(taken)

    def _check_owner(self) -> None:
        if os.getpid() != self._pid:
            raise UsageError(
                f"the pool of {self.env.name} belongs to process {self._pid}, which this "
                "process was forked from; make a pool here"
            )

    def _let_go(self, rt: Runtime) -> None:
        """Forget an environment another process claimed: it keeps running, theirs now."""
        with self._cond:
            self._baselines.pop(rt, None)
        rt.detach()

    def close(self) -> None:
        """Remove every environment still waiting, at once, after the starts in flight end;
        starts not begun yet are dropped (those handed out are their holders' to release).
        In a child forked from the pool's process it only closes the child's copy."""
        if os.getpid() != self._pid:
            self._closed = True
            return
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            watchers = list(self._watchers)
        for watcher in watchers:
            watcher()
        self._starts.shutdown(wait=True, cancel_futures=True)
        with self._cond:
            waiting, self._ready = list(self._ready), collections.deque()
        left = [item for item in waiting if isinstance(item, Runtime)]
        if left:
            with ThreadPoolExecutor(min(len(left), 8), thread_name_prefix="orch-pool") as ex:
                list(ex.map(self._close_one, left))

    def _close_one(self, item: Runtime) -> None:
        if item.pool_move("ready", "removing"):
            self._discard(item)
        else:
            self._let_go(item)


T = TypeVar("T")


def claim_ready(
    env: Environment,
    count: int,
    take: Callable[[Runtime], T],
    *,
    refused: Callable[[str, OrchestratorError], None] | None = None,
) -> list[T]:
    """Up to `count` environments taken from running pools (of any process) of `env`'s file,
    what `take` makes of each (`orchestrator up --pool` describes them). Each is claimed
    atomically against its pool and other claimers, handed to `take`, then kept: its pool,
    reapers and guardians leave it until it is removed by id. One that `take` fails on
    (OrchestratorError) goes back to its pool, `refused` is told why: never one claimed and
    lost. The pool's own states move only here and in `Pool`."""
    out: list[T] = []
    for ident in attachable(env):
        if len(out) == count:
            break
        try:
            rt = attach(ident)
        except OrchestratorError:
            continue  # removed meanwhile, or not one to hand out
        try:
            if rt.pool_state() != "ready" or not rt.pool_move("ready", "claimed"):
                continue
            try:
                made = take(rt)
                rt.keep()
            except OrchestratorError as exc:
                rt.pool_move("claimed", "ready")
                if refused is not None:
                    refused(ident, exc)
                continue
            except BaseException:  # (an interrupt, a bug in `take`): never claimed and lost
                rt.pool_move("claimed", "ready")
                raise
            out.append(made)
        finally:
            rt.detach()
    return out
