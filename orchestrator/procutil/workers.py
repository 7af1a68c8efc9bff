"""The threads a command needs (its runner, watchdog and stdin feeder): kept idle between
commands, since starting one costs about 1 ms under gVisor, and held before the process
they serve, since a fork bomb can take every pid before a thread starts after it. Standard
library only, Python 3.7+."""

from __future__ import annotations

import errno
import os
import threading
from typing import Callable, List, Optional

from .base import NoProcess, scope

IDLE_WORKERS = 3
"""Threads kept waiting after their job, for the next: a command takes up to three (its
runner in the executor, its watchdog, its stdin feeder), and starting a thread costs about
1 ms under gVisor (0.1 ms under runc), which each command would pay again."""
WORKER_NAME = "procutil-worker"
"""The name of a worker's thread (one kept idle outlives the command it served)."""
_idle: List["_Worker"] = []
_idle_lock = threading.Lock()


class _Worker:
    """A thread that runs the jobs it is given, one at a time; between them it waits among
    the idle (at most IDLE_WORKERS), or ends."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._job: Optional[Callable[[], None]] = None
        threading.Thread(
            target=self._serve, name=WORKER_NAME, daemon=True
        ).start()  # (or RuntimeError)

    def assign(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._job = job
            self._cond.notify()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while self._job is None:
                    self._cond.wait()
                job, self._job = self._job, None
            scope.__dict__.clear()  # nothing of the last job's (abandon_when) carries over
            job()  # a job that raises ends its thread, reported as any thread's would be
            with _idle_lock:
                if len(_idle) >= IDLE_WORKERS:
                    return
                _idle.append(self)


def _worker() -> _Worker:
    """An idle worker, or a new one (RuntimeError when no thread can start)."""
    with _idle_lock:
        if _idle:
            return _idle.pop()
    return _Worker()


def _forget_workers() -> None:
    """In a forked child: the idle workers' threads were not copied."""
    global _idle_lock
    _idle_lock = threading.Lock()
    del _idle[:]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)


def in_thread(job: Callable[[], None]) -> None:
    """Run `job` on a thread of its own (an idle worker's when there is one); RuntimeError
    when none can start."""
    _worker().assign(job)


class Spare:
    """A thread held before the process it will serve. Under a pids limit a command can
    take every free pid before a thread could start after it (a fork bomb does, in
    microseconds); a thread held first cannot be taken away, and the deadline it keeps
    then holds."""

    def __init__(self) -> None:
        self._worker: Optional[_Worker] = _worker()  # RuntimeError: before any process
        self._lock = threading.Lock()
        self._done = threading.Event()

    def give(self, job: Optional[Callable[[], None]]) -> "Spare":
        """Run `job` on the held thread, or let the thread go with None; only the first
        call counts."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is None:
            return self

        def work() -> None:
            try:
                if job is not None:
                    job()
            finally:
                self._done.set()

        worker.assign(work)
        return self

    def join(self) -> None:
        """Wait for the job given to end."""
        self._done.wait()


def hold_spares(count: int) -> List[Spare]:
    """`count` spare threads, or NoProcess when the container cannot start one."""
    spares: List[Spare] = []
    try:
        for _ in range(count):
            spares.append(Spare())
    except RuntimeError:  # the pids limit: nothing has started yet
        for spare in spares:
            spare.give(None)
        raise NoProcess(
            errno.EAGAIN, "cannot start a thread: the process limit is reached"
        ) from None
    return spares
