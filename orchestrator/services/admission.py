"""Admission by capacity: a spawn starts only while the host has room for it.

Each environment asks for what its backend applies to its containers: the sum of their
memory limits and of their CPU limits, over the main sandbox, every service and (on Docker)
the environment's own egress gateway and port forwarder (`Runtime.requested`). A container
whose file names no limit gets the caller's default (spec/limits.py: 1g, 1 CPU), and is
counted at it. It is admitted while what is admitted plus it stays within the budget:
ORCHESTRATOR_MAX_MEMORY (default 75% of MemTotal) and ORCHESTRATOR_MAX_CPUS (default: no
bound: a CPU limit is a ceiling on time that every container shares, so a container over it
is slowed, never killed, and sandboxes mostly wait; CPUs are counted, and bounded only where
the caller sets it; memory, which cannot be shared so, is counted one for one). The others
wait in a queue, first come first admitted: only the head of the queue may be admitted, so a
large request is never starved by a stream of small ones. A request larger than the whole
budget fails at once (UsageError); a wait past ORCHESTRATOR_ADMISSION_TIMEOUT (600 s) raises
AdmissionTimeout. ORCHESTRATOR_ADMISSION=0 turns admission off.

The queue is machine-wide for one user: the ledger (services/ledger.py) is a private folder
of tickets under the state folder, shared by every process of that user (and state folder).
Another user's processes have their own ledger and budget (documented limit: give each user
its share with ORCHESTRATOR_MAX_MEMORY). A ticket is released when its environment is
cleaned up; a detached one (`orchestrator up`) is held by its project folder until `down`; a
dead process's tickets are dropped. While it waits, a spawn logs a progress record to
ADMISSION_LOG about every second (the CLI draws it)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path

from orchestrator import settings
from orchestrator.errors import AdmissionTimeout, UsageError
from orchestrator.sandbox.backend import Amounts, gib
from orchestrator.sandbox.registry import get_runtime_class
from orchestrator.services.ledger import Ledger, Ticket
from orchestrator.spec.limits import DEFAULT_MEMORY_ENV
from orchestrator.spec.loader import Environment

ADMISSION_ENV = settings.ADMISSION.name
MAX_MEMORY_ENV = settings.MAX_MEMORY.name
MAX_CPUS_ENV = settings.MAX_CPUS.name
TIMEOUT_ENV = settings.ADMISSION_TIMEOUT.name
ADMISSION_LOG = "orchestrator.admission"
"""The logger of waiting spawns' progress (INFO records; `admission_done` on the last)."""
POLL = 0.1
"""Seconds between two looks at the ledger while waiting (a release in this process wakes
its waiters at once)."""
RECHECK = 1.0
"""Seconds after which a waiter looks at every ticket again though none changed (to find
holders that died)."""
STALE = 5.0
"""Seconds a waiting ticket may go without a heartbeat (its waiter looks at least every
RECHECK) before the others pass it over."""
COARSE_NS = 50_000_000
"""A folder's change time is coarse (a few ms): one this recent is looked at again anyway."""
REPORT_EVERY = 1.0
"""Seconds between two progress records of one waiting spawn (sooner when its place moves)."""

log = logging.getLogger(ADMISSION_LOG)
_released = threading.Condition()


def enabled() -> bool:
    return settings.ADMISSION.get()


def budget() -> Amounts:
    """What may be admitted at once (ORCHESTRATOR_MAX_MEMORY, ORCHESTRATOR_MAX_CPUS)."""
    return Amounts(settings.MAX_MEMORY.get(), settings.MAX_CPUS.get())


def _requested(env: Environment) -> Amounts:
    """What `env` asks of this host on the backend its file names (`Runtime.requested`)."""
    return get_runtime_class(env.backend).requested(env, None)


def timeout() -> float:
    return settings.ADMISSION_TIMEOUT.get()


def _sum(tickets: list[Ticket]) -> Amounts:
    return Amounts(sum(t.memory for t in tickets), sum(t.cpus for t in tickets))


class Admission:
    """One admitted environment's hold on the budget: `anchor` it to the folder that stands
    for it after this process, `release` it when it is gone (idempotent)."""

    def __init__(self, ledger: Ledger, ticket: Ticket) -> None:
        self.ledger, self.ticket = ledger, ticket
        self._lock = threading.Lock()
        self._released = False

    def anchor(self, folder: Path | None) -> None:
        if folder is None:
            return
        with self._lock:
            if not self._released:
                self.ticket = self.ledger.anchor(self.ticket, folder)

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
            self.ledger.release(self.ticket.name)
        with _released:
            _released.notify_all()


def check_admission(env: Environment, count: int = 1, *, want: Amounts | None = None) -> None:
    """UsageError when `count` environments of `env` held at once (a batch such as
    `orchestrator up -n N`, whose first ones hold the room its last ones need) could never
    be admitted together: such a batch would wait on itself until the admission timeout.
    `want`: what one asks for (default: what its backend applies, `Runtime.requested`)."""
    if not enabled():
        return
    one, limit = want or _requested(env), budget()
    want = Amounts(one.memory * count, one.cpus * count)
    if not want.fits(Amounts(0, 0.0), limit):
        many = f"{count} environments of {env.name} ask" if count > 1 else f"{env.name} asks"
        raise UsageError(
            f"{many} for {want.words()} (the limits of their containers, "
            f"{DEFAULT_MEMORY_ENV} for each that declares no memory), more than this host "
            f"admits at once ({limit.words()}): declare less, start fewer, or raise "
            f"{MAX_MEMORY_ENV} / {MAX_CPUS_ENV} (or set {ADMISSION_ENV}=0)"
        )


def admit(
    env: Environment, *, wait: float | None = None, want: Amounts | None = None
) -> Admission | None:
    """Wait (up to `wait` seconds, default ORCHESTRATOR_ADMISSION_TIMEOUT) until `env`,
    asking `want` (default: what its backend applies), is admitted; None when admission is
    off. UsageError at once when it asks for more than the whole budget; AdmissionTimeout
    past the wait."""
    if not enabled():
        return None
    want = want or _requested(env)
    check_admission(env, want=want)
    limit = budget()
    seconds = timeout() if wait is None else wait
    ledger = Ledger()
    ticket = ledger.enqueue(want.memory, want.cpus, env.name)
    try:
        return Admission(ledger, _wait(ledger, ticket, want, limit, seconds))
    except BaseException:
        ledger.release(ticket.name)
        with _released:
            _released.notify_all()  # those behind it move up
        raise


def _wait(ledger: Ledger, mine: Ticket, want: Amounts, limit: Amounts, seconds: float) -> Ticket:
    deadline = time.monotonic() + seconds
    last: tuple[int, int] | None = None
    reported = 0.0
    seen, looked = -1, 0.0
    while True:
        changed, now = ledger.changed(), time.monotonic()
        if changed != seen or now - looked >= RECHECK or time.time_ns() - changed < COARSE_NS:
            seen, looked = changed, now
            ahead, used = _look(ledger, mine, want, limit)
            if ahead < 0:
                if last is not None:
                    log.info("admitted %s", mine.env, extra={"admission_done": True})
                return replace(mine, admitted=True)
        if now >= deadline:
            raise _timed_out(mine, want, limit, seconds, ledger, ahead)
        if (ahead, used.memory) != last or now - reported >= REPORT_EVERY:
            last, reported = (ahead, used.memory), now
            log.info(
                "waiting for room: %d ahead, %s GiB of %s GiB admitted",
                ahead,
                gib(used.memory),
                gib(limit.memory),
                extra={"admission_ahead": ahead, "admission_done": False},
            )
        with _released:
            _released.wait(max(0.0, min(POLL, deadline - now)))


def _look(ledger: Ledger, mine: Ticket, want: Amounts, limit: Amounts) -> tuple[int, Amounts]:
    """Admit `mine` if it heads the queue and fits: (-1, used) then; else (how many wait
    ahead of it, what is admitted)."""
    with ledger.locked():
        tickets = ledger.read()
        if not any(t.name == mine.name for t in tickets):
            ledger.write(mine)  # removed under us (by hand?): back in its place
            tickets = sorted([*tickets, mine], key=lambda t: (t.seq, t.name))
        ledger.heartbeat(mine.name)
        admitted = [t for t in tickets if t.admitted]
        # a waiter that has stopped looking (its process stopped: Ctrl-Z, a debugger) is
        # passed over until it looks again, or it would hold everyone behind it
        waiting = [
            t
            for t in tickets
            if not t.admitted and (t.name == mine.name or ledger.quiet_for(t.name) < STALE)
        ]
        ahead = [t.name for t in waiting].index(mine.name)
        used = _sum(admitted)
        if ahead == 0 and want.fits(used, limit):
            ledger.write(replace(mine, admitted=True))
            return -1, used
        return ahead, used


def _timed_out(
    mine: Ticket, want: Amounts, limit: Amounts, seconds: float, ledger: Ledger, ahead: int
) -> AdmissionTimeout:
    admitted = [t for t in ledger.snapshot() if t.admitted]
    used = _sum(admitted)
    counts: dict[str, int] = {}
    for t in admitted:
        counts[t.env] = counts.get(t.env, 0) + 1
    names = ", ".join(f"{n} x{c}" for n, c in sorted(counts.items())[:10]) or "none"
    return AdmissionTimeout(
        f"{mine.env} (asking {want.words()}) found no room within {seconds:g} s: "
        f"{used.words()} of the budget of {limit.words()} are admitted to {len(admitted)} "
        f"environments ({names}), {ahead} more waiting ahead. Wait for some to end "
        f"(`orchestrator ps`, `orchestrator down`), raise {MAX_MEMORY_ENV} / {MAX_CPUS_ENV}, "
        f"or allow a longer wait with {TIMEOUT_ENV}"
    )


def admitted() -> list[Ticket]:
    """The tickets admitted now, in queue order (for tests and diagnostics)."""
    return [t for t in Ledger().snapshot() if t.admitted]
