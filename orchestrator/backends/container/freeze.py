"""Pause and resume of a container environment: every container of it that runs (the main
sandbox and each service but the jobs, which have ended) frozen by its engine's cgroup
freezer (`docker pause`), one call per engine (Compose: one; Swarm: one per node running a
task), and thawed by `docker unpause`.

Nothing in the sandbox has a say: the freezer is set from outside the container on every
process of its cgroup at once, and a frozen process runs no instruction, so it can neither
notice nor undo it, nor can another container of the environment (all are frozen). Memory
stays as it is: resuming costs one engine call per engine, not a restart.

All or none: when an engine refuses a container that runs, whatever was frozen is thawed
again and the error says why. A container in the wanted state already (paused by another
process, `orchestrator pause`) or not running at all (a service that died: nothing of it
runs) is not an error, so `pause` and `resume` are idempotent whoever paused. Every engine
call is bounded (ORCHESTRATOR_ENGINE_TIMEOUT).

A process of a paused container can still be killed from this host (`kill_frozen`: the
engine refuses `docker exec` into a paused container): SIGKILL waits in the frozen process,
which dies at the thaw before it runs one more instruction. Nothing of the sandbox's image
runs for it (a root sandbox may have replaced every program there), and no container is
made: the processes are found in this host's /proc, by the container's cgroup and the
command's mark in their environment."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping

from orchestrator import procutil
from orchestrator.backends.container.engine import Engine, FreezerBusy
from orchestrator.errors import DockerError, OrchestratorError, UsageError
from orchestrator.spec.loader import Environment
from orchestrator.spec.policy import Policy
from orchestrator.spec.resolve import MAIN

Groups = dict[Engine, list[str]]
"""Containers by the engine that runs them."""


def groups(services: list[str], locate: Callable[[str], tuple[str, Engine]]) -> Groups:
    """The containers of `services` (every service but the jobs, which have ended), by the
    engine that runs them (`locate`: the runtime's placement)."""
    out: Groups = {}
    for service in services:
        container, engine = locate(service)
        out.setdefault(engine, []).append(container)
    return out


def refuse_gvisor(env: Environment, policy: Policy) -> None:
    """UsageError when containers of `env` run under gVisor (as `policy` places them):
    runsc (ptrace) thaws a sandbox whose sleeping processes never wake."""
    spec = env.spec
    gvisor = [n for n in [MAIN, *spec.services] if policy.isolation_of(spec, n) == "gvisor"]
    if gvisor:
        raise UsageError(
            f"{env.name}: cannot pause an environment under isolation: gvisor "
            f"({', '.join(gvisor)}): gVisor's runsc resumes it with its sleeping "
            "processes stuck; suspend it to disk instead (rt.suspend, orchestrator "
            "suspend), or use runc"
        )


def pause(groups: Groups) -> None:
    """Freeze every container of `groups`; all or none (see the module)."""
    done: list[tuple[Engine, list[str]]] = []
    for engine, containers in groups.items():
        done.append((engine, containers))  # a refused call may have frozen some of them
        try:
            _freeze(engine, containers)
        except DockerError as exc:
            if _unsettled(engine, containers, paused=True):
                for there, undo in done:  # thaw what was frozen, then say why
                    with contextlib.suppress(OrchestratorError):
                        there.unpause(undo)
                raise OrchestratorError(f"could not pause the environment: {exc}") from exc


FREEZE_TRIES = 3
"""Attempts at a pause the freezer gave up on: a cgroup v1 freezer chasing processes that
fork fast says "unable to freeze" now and then, and freezes at the next try."""


def _freeze(engine: Engine, containers: list[str]) -> None:
    for attempt in range(FREEZE_TRIES):
        try:
            engine.pause(containers)
            return
        except FreezerBusy:
            if attempt == FREEZE_TRIES - 1:
                raise
            try:  # those frozen already would refuse a second pause
                states = engine.paused_states(containers)
            except OrchestratorError:
                states = []
            left = [c for c, (_, on) in zip(containers, states, strict=False) if not on]
            if states and not left:
                return  # the freezer got there after all
            containers = left or containers
            time.sleep(0.1 * (attempt + 1))


def resume(groups: Groups) -> None:
    """Thaw every container of `groups` (those not paused are left as they are)."""
    failed: DockerError | None = None
    for engine, containers in groups.items():  # every engine, also after one failed
        try:
            engine.unpause(containers)
        except DockerError as exc:
            if _unsettled(engine, containers, paused=False):
                failed = exc
    if failed is not None:
        raise OrchestratorError(f"could not resume the environment: {failed}") from failed


def _unsettled(engine: Engine, containers: list[str], *, paused: bool) -> bool:
    """Whether a container that runs is not in the wanted state after a refused call (a
    container that is gone or cannot be inspected counts as unsettled)."""
    try:
        states = engine.paused_states(containers)
    except OrchestratorError:
        return True
    if len(states) != len(containers):
        return True
    return any(running and is_paused != paused for running, is_paused in states)


def kill_frozen(engine: Engine, container: str, marks: Mapping[bytes, bytes]) -> bool:
    """SIGKILL, from this host, every process of `container` (paused, or not) whose
    environment holds one of `marks` (name -> value) or that is in a session listed under
    the key b"session" (space-separated ids). Whether that could be judged: the container's
    processes are visible here (an engine on this machine) and their environments readable
    (this process is root, or the sandbox's user is ours); False otherwise (the caller owes
    the kill, run right after the thaw: owed.py)."""
    ident, first = engine.first_process(container)
    pid = str(first)
    if first <= 0 or not _in_container(first, ident):
        return False
    sessions = set(marks.get(b"session", b"").split())
    wanted = [f"{k.decode()}={v.decode()}".encode() for k, v in marks.items() if k != b"session"]
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry == pid or not _in_container(int(entry), ident):
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read(1 << 20).split(b"\0")
        except FileNotFoundError:
            continue  # gone meanwhile
        except OSError:
            return False  # not ours to read: another user's sandbox
        fields = procutil.stat_fields(entry)
        session = fields[5] if len(fields) > 5 else b""
        if any(w in env for w in wanted) or session in sessions:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)
    return True


def _in_container(pid: int, ident: str) -> bool:
    """Whether process `pid` of this host is in the container `ident`'s cgroup."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            return ident.encode() in f.read(1 << 16) if ident else False
    except OSError:
        return False
