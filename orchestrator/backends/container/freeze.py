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

A process of a paused container can still be killed, by a container of its own that shares
the paused one's process namespace (`kill_frozen`; the engine refuses `docker exec` into a
paused container): the signal waits in the frozen process, which dies at the thaw before it
runs one more instruction."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence

from orchestrator.backends.container.engine import FreezerBusy, run_cli
from orchestrator.errors import DockerError, OrchestratorError

Groups = dict[tuple[str, ...], list[str]]
"""Containers by the docker command that reaches their engine."""


def pause(groups: Groups) -> None:
    """Freeze every container of `groups`; all or none (see the module)."""
    done: list[tuple[tuple[str, ...], list[str]]] = []
    for docker_cmd, containers in groups.items():
        done.append((docker_cmd, containers))  # a refused call may have frozen some of them
        try:
            _freeze(docker_cmd, containers)
        except DockerError as exc:
            if _unsettled(docker_cmd, containers, paused=True):
                for cmd, undo in done:  # thaw what was frozen, then say why
                    with contextlib.suppress(OrchestratorError):
                        _call(cmd, "unpause", undo)
                raise OrchestratorError(f"could not pause the environment: {exc}") from exc


FREEZE_TRIES = 3
"""Attempts at a pause the freezer gave up on: a cgroup v1 freezer chasing processes that
fork fast says "unable to freeze" now and then, and freezes at the next try."""


def _freeze(docker_cmd: Sequence[str], containers: list[str]) -> None:
    for attempt in range(FREEZE_TRIES):
        try:
            _call(docker_cmd, "pause", containers)
            return
        except FreezerBusy:
            if attempt == FREEZE_TRIES - 1:
                raise
            try:  # those frozen already would refuse a second pause
                states = paused_states(docker_cmd, containers)
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
    for docker_cmd, containers in groups.items():  # every engine, also after one failed
        try:
            _call(docker_cmd, "unpause", containers)
        except DockerError as exc:
            if _unsettled(docker_cmd, containers, paused=False):
                failed = exc
    if failed is not None:
        raise OrchestratorError(f"could not resume the environment: {failed}") from failed


def paused_states(docker_cmd: Sequence[str], containers: list[str]) -> list[tuple[bool, bool]]:
    """(running, paused) of each container, in order (one engine call)."""
    fmt = "{{.State.Running}} {{.State.Paused}}"
    out = run_cli(
        "inspecting the containers", [*docker_cmd, "inspect", "--format", fmt, *containers]
    )
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return [(row[0] == "true", row[-1] == "true") for row in rows]


def _unsettled(docker_cmd: Sequence[str], containers: list[str], *, paused: bool) -> bool:
    """Whether a container that runs is not in the wanted state after a refused call (a
    container that is gone or cannot be inspected counts as unsettled)."""
    try:
        states = paused_states(docker_cmd, containers)
    except OrchestratorError:
        return True
    if len(states) != len(containers):
        return True
    return any(running and is_paused != paused for running, is_paused in states)


def _call(docker_cmd: Sequence[str], verb: str, containers: list[str]) -> None:
    run_cli(f"{verb} of {len(containers)} container(s)", [*docker_cmd, verb, *containers])


def kill_frozen(
    docker_cmd: Sequence[str], container: str, user: str | None, argv: list[str], name: str
) -> str:
    """Run `argv` (a script of shell builtins: the plain path's KILL_TREE) in a new
    container `name` of `container`'s own image that shares its process namespace, as `user`
    (None: the image's), while `container` may be paused; its output. That container has
    the capabilities of `container` (no fewer: the kernel lets a process read another's
    environment, where the command's mark is, only when it holds every capability the other
    holds; and no more), no network, no privilege to gain, a read-only filesystem, a few
    processes and little memory, and is removed when it ends, or when the engine would not
    start it (Podman will not, into a paused container's namespace: it would then hold that
    container up); it runs the image the sandbox runs, with nothing of the sandbox's own
    filesystem."""
    fmt = "{{.Image}}\t{{json .HostConfig.CapAdd}}\t{{json .HostConfig.CapDrop}}"
    said = run_cli("inspecting the sandbox", [*docker_cmd, "inspect", "--format", fmt, container])
    image, added, dropped = [*said.strip().split("\t"), "", "", ""][:3]
    run = [*docker_cmd, "run", "--rm", "--name", name, "--pull", "never"]
    run += [f"--pid=container:{container}", "--network", "none", "--read-only"]
    run += ["--security-opt", "no-new-privileges", "--pids-limit", "8", "--memory", "64m"]
    run += ["--log-driver", "none"]
    run += [f"--cap-drop={cap}" for cap in _caps(dropped)]
    run += [f"--cap-add={cap}" for cap in _caps(added)]
    if user:
        run += ["--user", user]
    run += ["--entrypoint", argv[0], image, *argv[1:]]
    try:
        return run_cli("killing a command in the paused sandbox", run)
    except DockerError:
        with contextlib.suppress(OrchestratorError):  # (gone already: what --rm did)
            run_cli("removing the killer", [*docker_cmd, "rm", "--force", name])
        raise


def _caps(said: str) -> list[str]:
    """Capability names from the engine's JSON list (null: none)."""
    try:
        caps = json.loads(said or "null") or []
    except ValueError:
        return []
    return [c for c in caps if isinstance(c, str) and c.replace("_", "").isalnum()]
