"""When a start is done with its extra services, on every container backend.

A start waits, within ORCHESTRATOR_UP_TIMEOUT, until each service is ready: running (a
plain sidecar), healthy (one with a healthcheck) or, for a `job`, ended with exit code 0.
Then, as the main sandbox comes up, each service that keeps running must still run SETTLE
seconds after it was first seen running, so a sidecar that crashes as it starts (a bad
config read after 200 ms, a crash loop) is not reported ready. Any other outcome fails the
start with the service's exit code and last log lines; the caller removes the environment.
A service that dies later is the environment's own business: the main sandbox still runs
commands (`rt.service(NAME)` says the service is gone).

The engine is asked through the runtime's own `_state` and `_logs` (passed in by the
runtime), so Compose and Swarm keep one rule."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import procutil
from orchestrator.backends.container.engine import (
    TIMED_OUT,
    UP_TIMEOUT_ENV,
    NoSuchContainer,
    up_timeout,
)
from orchestrator.errors import DockerError, HealthcheckFailed, OrchestratorError
from orchestrator.paths import read_regular

if TYPE_CHECKING:  # (the file's models load pydantic: `ps --usage` needs none of them)
    from orchestrator.spec.models import Service

SETTLE = 1.0
"""Seconds a service that keeps running must still run after it was first seen running."""
POLL = 0.1
"""Seconds between two looks at the services."""
LOG_LINES = 20
LOG_CHARS = 4000
"""Most of a service's log tail an error shows (the tail of the tail, sanitized)."""
ENDED = ("exited", "dead", "removing")
"""Container states after the service's command ended."""


@dataclass(frozen=True)
class Look:
    """One look at a service's container."""

    status: str
    """The engine's container status: created, running, paused, restarting, exited, dead."""
    exit_code: int | None
    health: str
    """"", starting, healthy or unhealthy."""
    oom: bool

    @classmethod
    def of(cls, state: Any) -> Look:
        """From python-on-whales' ContainerState (any object with those attributes)."""
        health = getattr(getattr(state, "health", None), "status", None)
        code = getattr(state, "exit_code", None)
        return cls(
            status=str(getattr(state, "status", "") or ""),
            exit_code=code if isinstance(code, int) else None,
            health=str(health or ""),
            oom=bool(getattr(state, "oom_killed", False)),
        )

    @property
    def ended(self) -> bool:
        return self.status in ENDED


def log_tail(text: str) -> str:
    """The last LOG_LINES lines of a service's log, at most LOG_CHARS characters, with
    control characters (a hostile service's terminal escapes) shown as `?`."""
    lines = text.strip().splitlines()[-LOG_LINES:]
    tail = "\n".join(lines)[-LOG_CHARS:]
    return "".join(c if c in "\n\t" or c.isprintable() else "?" for c in tail)


def failure(ident: str, service: str, job: bool, look: Look, logs: str) -> str:
    """The message of a start failed by one service: what it did, and what to do next."""
    code = "" if look.exit_code is None else f" with code {look.exit_code}"
    oom = " (killed: out of memory)" if look.oom else ""
    if job:
        what = f"job {service!r} exited{code}{oom}; a job must exit 0"
    elif look.health == "unhealthy":
        what = f"service {service!r} never became healthy"
    elif look.ended:
        what = (
            f"service {service!r} exited{code}{oom} during the start; a service must keep "
            "running (mark a one-shot service `job: true`)"
        )
    else:
        what = f"service {service!r} did not start ({look.status or 'no container'})"
    shown = log_tail(logs)
    return f"{ident}: {what}; last log lines:\n{shown or '(no output)'}"


def late(ident: str, service: str, job: bool, look: Look, logs: str, timeout: float) -> str:
    """The message of a start whose service was not ready (a job not ended, a healthcheck
    not passed) within `timeout` seconds."""
    kind = "job" if job else "service"
    now = look.status + (f", {look.health}" if look.health else "")
    shown = log_tail(logs)
    return (
        f"{ident}: {kind} {service!r} was not ready within {timeout:g}s ({now}); "
        f"give it more time with {UP_TIMEOUT_ENV}; last log lines:\n{shown or '(no output)'}"
    )


def not_ready(look: Look, job: bool) -> bool:
    """Whether a service that has not failed is still short of ready."""
    if job:
        return not look.ended
    return look.health == "starting" or look.status in ("created", "restarting")


class ServiceWatch:
    """The start's watch over the extra services: `started()` once they were made (and
    prepared), `settled()` once the main sandbox is up (the settle window overlaps it)."""

    def __init__(
        self,
        ident: str,
        services: Mapping[str, Service],
        state: Callable[[str], Any],
        logs: Callable[[str], str],
        *,
        timeout: float,
        settle: float = SETTLE,
        ran_for: Callable[[str], float | None] | None = None,
    ) -> None:
        self.ident = ident
        self.services = dict(services)
        self._state = state
        self._logs = logs
        self.timeout = timeout
        self.settle = settle
        self.ran_for = ran_for
        """How long a service's command has run, by this machine's kernel (None: not
        known): its settle window then runs from its start, not from when it was first
        seen running (`ran_for`, below)."""
        self._seen: dict[str, float] = {}
        """Monotonic time each service that keeps running started (or was first seen
        running)."""

    def _tail(self, service: str) -> str:
        try:
            return self._logs(service)
        except OrchestratorError as exc:  # the logs are a courtesy: the failure is the news
            return f"(its logs could not be read: {exc})"

    def _fail(self, service: str, look: Look) -> HealthcheckFailed:
        job = self.services[service].job
        return HealthcheckFailed(failure(self.ident, service, job, look, self._tail(service)))

    def _ready(self, service: str, look: Look) -> bool:
        """Whether a service is ready; raises when it never will be."""
        if self.services[service].job:
            if look.ended:
                if look.exit_code == 0:
                    return True
                raise self._fail(service, look)
            return False
        if look.ended or look.health == "unhealthy":
            raise self._fail(service, look)
        running = look.status in ("running", "paused")
        if running and service not in self._seen:
            seen = time.monotonic()
            ran = self.ran_for(service) if self.ran_for is not None else None
            if ran is not None:  # (never more than the window)
                seen -= min(max(0.0, ran), self.settle)
            self._seen[service] = seen
        if self.services[service].healthcheck is not None:
            return running and look.health == "healthy"
        return running

    def started(self) -> None:
        """Wait (within `timeout`) until every service is ready."""
        deadline = time.monotonic() + self.timeout
        waiting = sorted(self.services)
        while True:
            waiting = [s for s in waiting if not self._ready(s, Look.of(self._state(s)))]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise self._late(waiting[0])
            time.sleep(POLL)

    def _late(self, service: str) -> HealthcheckFailed:
        look = Look.of(self._state(service))
        job = self.services[service].job
        return HealthcheckFailed(
            late(self.ident, service, job, look, self._tail(service), self.timeout)
        )

    def settled(self) -> None:
        """Once every service that keeps running has run `settle` seconds since it was
        first seen running, check that each still runs."""
        if not self._seen:
            return
        wait = max(self._seen.values()) + self.settle - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        for service in sorted(self._seen):
            look = Look.of(self._state(service))
            if look.ended:
                raise self._fail(service, look)


PAUSED = "; resume it (rt.resume(), `orchestrator resume ID`), or take the environment down"
"""How a probe's reason ends for a paused container."""


def unusable(what: str, state: Callable[[], Any], logs: Callable[[], str]) -> str | None:
    """Why a container (`what`, as the message names it) cannot run commands: gone,
    stopped (with its last log lines) or paused; None if it can. `state`, `logs`: the
    runtime's look at it and at its log tail."""
    try:
        found = state()
    except NoSuchContainer as exc:
        return f"{what} is gone ({exc.stderr.strip() or exc})"
    except DockerError as exc:
        if exc.returncode == TIMED_OUT:  # the engine is not answering: say that instead
            raise
        return f"{what} cannot be inspected ({exc.stderr.strip() or exc})"
    if found.paused:
        return f"{what} is paused{PAUSED}"
    if found.running:
        return None
    why = f"{found.status}, exit code {found.exit_code}"
    if found.oom_killed:
        why += ", killed by the out-of-memory killer"
    if found.error:
        why += f": {found.error}"
    try:
        tail = logs().strip()
    except OrchestratorError:
        tail = ""
    return f"{what} is not running ({why}); last log lines:\n{tail or '(none)'}"


def wait_healthy(
    label: str, services: list[str], state: Callable[[str], Any], logs: Callable[[str], str]
) -> None:
    """Wait, within ORCHESTRATOR_UP_TIMEOUT, until each service's healthcheck passes; an
    unhealthy or stopped service is a HealthcheckFailed with its last log lines."""
    deadline = time.monotonic() + up_timeout()
    for service in services:
        while True:
            found = state(service)
            health = getattr(found.health, "status", None)
            if health == "healthy":
                break
            if health == "unhealthy" or not found.running or time.monotonic() > deadline:
                tail = logs(service).strip()
                raise HealthcheckFailed(
                    f"{label}: service {service!r} never became healthy; "
                    f"last log lines:\n{tail or '(no output)'}"
                )
            time.sleep(0.2)


PF_EXITING = 0x4
"""In /proc/PID/stat's flags: the process is exiting. A container's first process killed
stays so while the kernel kills every other process of its namespace (long, with many)."""


def runs_here(got: dict[str, Any] | None) -> bool:
    """Whether a container the engine inspected (`got`, its API's answer; None: not asked)
    runs, with its first process alive on this machine, in a cgroup naming the container's
    id: the engine runs on this machine's kernel (not in a VM), and the process is that
    container's. Nothing a sandbox does inside changes its first process's host pid or
    cgroup."""
    state = (got or {}).get("State")
    cid = (got or {}).get("Id")
    if not isinstance(state, dict) or not isinstance(cid, str) or len(cid) < 12:
        return False
    pid = state.get("Pid")
    if state.get("Running") is not True or not isinstance(pid, int) or pid <= 0:
        return False
    fields = procutil.stat_fields(pid)
    if len(fields) < 7 or fields[0] in (b"Z", b"X"):  # gone, or dead and not yet reaped
        return False
    if int(fields[6]) & PF_EXITING:  # dying: its namespace's processes are being killed
        return False
    cgroup = read_regular(Path(f"/proc/{pid}/cgroup"), 1 << 16) or b""
    return cid.encode() in cgroup


def ran_for(got: dict[str, Any] | None) -> float | None:
    """Seconds the container the engine inspected (`got`) has run, from its first process's
    start by this machine's kernel, where that process runs here in a cgroup naming the
    container (`runs_here`: never an engine in a VM, whose clock may differ); None
    otherwise. A pid taken again meanwhile is a younger process: less, never more. The
    first process may be an init (docker-init, gVisor's sandbox) that began before the
    command: the engine's own start time, when it is later, is taken instead."""
    if not runs_here(got):
        return None
    state = (got or {})["State"]
    fields = procutil.stat_fields(state["Pid"])
    try:
        began = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # (since boot, as BOOTTIME)
        kernel = time.clock_gettime(time.CLOCK_BOOTTIME) - began
    except (IndexError, ValueError, OSError):
        return None
    try:
        started = datetime.fromisoformat(str(state.get("StartedAt") or "")).timestamp()
    except ValueError:
        started = float("-inf")
    return max(0.0, min(kernel, time.time() - started))


LISTENING = b"0A"
"""A socket's state in /proc/net/tcp when it listens (the kernel's TCP_LISTEN)."""


def listening(pid: int, ports: set[int]) -> bool | None:
    """Whether something listens on each of `ports` (TCP, any address) in the network
    namespace of process `pid`, as this machine's kernel lists its sockets
    (/proc/PID/net/tcp and tcp6): a container's ports seen from outside, without an exec
    into it. None when that cannot be read (the process is gone, or is not ours to look
    at). Bounded: the lists are read up to a MiB each, and listening sockets come first."""
    heard: set[int] = set()
    for name in ("tcp", "tcp6"):
        text = read_regular(Path(f"/proc/{pid}/net/{name}"), 1 << 20)
        if text is None:
            if name == "tcp":
                return None
            continue  # (a kernel without IPv6)
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == LISTENING:
                with contextlib.suppress(ValueError):
                    heard.add(int(fields[1].rpartition(b":")[2], 16))
    return ports <= heard


def main_gone(folder: Path, ident: str, within: float = 2.0) -> str | None:
    """Why environment `ident`'s main container cannot run commands, as `unusable` says it,
    asked of the engine its project folder `folder` records, for up to `within` seconds
    while it still reads as running (a container removed or killed takes its executor down
    before the engine says so): what the endpoint's `exec` says when its resident went away
    under a command, as the full CLI does. None when it runs, or where its engine is not on
    this machine's socket (nothing more to say than that the executor went away)."""
    from orchestrator.backends.container.engine import ContainerState, Engine
    from orchestrator.backends.container.identity import folder_engine

    host = folder_engine(folder)
    if host is None:
        return None
    engine = Engine.at(host)
    container, action = f"{ident}-main-1", "inspecting the sandbox"

    def state() -> Any:
        got = engine.inspected(container, action)
        if got is None:
            raise LookupError(container)
        return ContainerState.of(got.get("State"))

    def logs() -> str:
        return b"".join(engine.logs(container, tail=20, follow=False)).decode(errors="replace")

    deadline = time.monotonic() + within
    try:
        while (why := unusable("its main container", state, logs)) is None:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)
    except (LookupError, OrchestratorError):  # no socket, or an engine that does not answer
        return None
    return why
