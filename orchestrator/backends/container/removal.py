"""Removing a project's objects by id, whoever else removes them at the same time: the
engine fails a call over the part someone else removed already, or refuses a container
another removal holds; what is left is listed and removed again."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from orchestrator.backends.container.engine import (
    Engine,
    NetworkInUse,
    RemovalInProgress,
    VolumeInUse,
)
from orchestrator.backends.container.identity import LABEL_PROJECT
from orchestrator.errors import DockerError

log = logging.getLogger("orchestrator.docker")


LEAVE_WITHIN = 10.0
"""Seconds `leave_networks` takes at most, in all: past them, the rest go down together."""
TURN = 0.25
"""Seconds between the stops of a project's services when its owner process dies (their
tethers: backends/docker/tether.py), so that they do not take endpoints of one network away
at the same moment (see `leave_networks`). The main sandbox stops at once."""
STOP_AFTER_TURNS = 10.0
"""Seconds a dead owner's service is given to stop once its turn came: its tether's SIGTERM,
its SIGKILL 2 s later, and the engine's time to see it (3 s were too few for a service of
nine on a loaded machine: its guardian took it off its networks while it still ran)."""
UP = frozenset({"running", "paused"})
"""The states of a container whose endpoints go when it ends (a paused one can leave a
network; one paused by another process goes with the rest)."""
UNJOINABLE = frozenset({"none", "host"})
"""Networks a container is on by its mode, which no disconnect takes it off."""


def leave_networks(
    engine: Engine, containers: Iterable[dict[str, Any]], action: str, seconds: float = LEAVE_WITHIN
) -> None:
    """Before the running (or paused) containers of `containers` (as the API lists them:
    `Id`, `State`, `NetworkSettings`) are stopped or killed together: on each network two
    or more of them are on, take all of them but the last off it, one at a time, so that
    each network loses at most one of their endpoints as they go.

    Why: Docker 20.10 engines (20.10.24, the one Debian 12 ships, among them) can deadlock
    when two endpoints of one network go at once: the engine's cleanup of one endpoint
    takes its network lock, then its controller's, while its watcher of another endpoint's
    removal takes them the other way round. From then on every network call of the engine
    hangs (`docker network ls`, starts, stops), until the engine is restarted. Containers
    of one project that exit together (a `down`, a kill) would take their endpoints on the
    project's networks away together. Only on an engine on this machine's socket that is
    Docker's (Podman has no such lock); a failure is logged and the stop goes on (those
    containers then leave as before); past `seconds`, nothing more is asked."""
    if engine.socket is None or engine.kind != "docker":
        return
    members: dict[str, list[str]] = {}  # network id -> the running containers on it
    for container in containers:
        ident = str(container.get("Id", ""))
        settings = container.get("NetworkSettings")
        networks = settings.get("Networks") if isinstance(settings, dict) else None
        if container.get("State") not in UP or not ident or not isinstance(networks, dict):
            continue
        for name, joined in sorted(networks.items()):
            network = joined.get("NetworkID") if isinstance(joined, dict) else None
            if name not in UNJOINABLE and network:
                members.setdefault(str(network), []).append(ident)
    leaving = sorted(
        {(ident, network) for network, idents in members.items() for ident in idents[:-1]}
    )
    deadline = time.monotonic() + seconds
    for ident, network in leaving:  # (one container's networks after another's)
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            engine.leave(network, ident, action=action, seconds=max(1.0, left))
        except DockerError as exc:
            log.info("%s: a container did not leave a network first: %s", action, exc)


def leave_project_networks(engine: Engine, name: str, action: str) -> None:
    """`leave_networks` for every container of project `name` (listed here)."""
    if engine.socket is None or engine.kind != "docker":
        return
    try:
        found = engine.labelled_containers(f"{LABEL_PROJECT}={name}", action=action)
    except DockerError as exc:
        log.info("%s: its containers were not listed to leave their networks: %s", action, exc)
        return
    leave_networks(engine, found, action)


def listed(engine: Engine, name: str) -> tuple[list[str], list[str]]:
    """The ids of the containers and networks carrying project label `name`."""
    label, action = f"{LABEL_PROJECT}={name}", f"listing project {name}"
    return (
        engine.ids("container", label=label, action=action),
        engine.ids("network", label=label, action=action),
    )


def remove_by_label(name: str, engine: Engine | None = None) -> int:
    """Remove every container, network and volume carrying project label `name`, by id."""
    engine = engine or Engine.at()
    return remove(engine, name, *listed(engine, name))


REMOVE_TRIES = 5
"""Tries of a removal by label, a moment more apart each time (2 s of waiting in all)."""
REMOVE_WAIT = 30.0
"""Seconds a removal waits at most for containers another process is removing already (a
reaper, a guardian, a `down`): the engine refuses a second removal meanwhile, and removing
a container whose layer holds many files takes seconds, more on a busy engine. As long for
a network the engine still says is in use once nothing joined it is left."""


def remove(engine: Engine, name: str, containers: list[str], networks: list[str]) -> int:
    """Remove these containers, the volumes labelled with the project and these networks
    (after disconnecting whatever else joined them), each kind whatever became of the
    others. Others may be removing the same project at once (a reaper, the owner's guardian,
    a `down`); the engine then fails the whole call over the part already gone, or refuses
    a container another removal holds, so on failure we list what is left and go again: the
    project ends up removed whoever removes which, or the last failure is raised (a volume
    someone else's container holds, say; or, after REMOVE_WAIT, a removal of someone else's
    that does not end)."""
    count = 0
    if containers:
        leave_project_networks(engine, name, f"removing project {name}")
    deadline = time.monotonic() + REMOVE_WAIT
    attempt = 0
    while True:
        gone, failed = _remove_once(engine, name, containers, networks)
        if failed is None:
            return count + len(containers) + len(networks) + gone
        left = listed(engine, name)
        # another's removal of a container, or the engine's own of an endpoint (a network
        # stays "in use" a while after its last container went, under load): worth waiting
        waiting = isinstance(failed, (RemovalInProgress, NetworkInUse))
        waiting = waiting and time.monotonic() < deadline
        last = attempt >= REMOVE_TRIES - 1 and not waiting
        if last and (left[0] or left[1] or project_volumes(engine, name)):
            raise failed
        count += len(containers) + len(networks) - len(left[0]) - len(left[1])
        containers, networks = left
        if last:
            return count
        time.sleep(min(0.2 * (attempt + 1), 1.0))
        attempt += 1


def _remove_once(
    engine: Engine, name: str, containers: list[str], networks: list[str]
) -> tuple[int, DockerError | None]:
    """One try of `remove`: how many volumes it removed, and its first failure."""
    action = f"removing project {name}"
    volumes: list[str] = []
    failed: DockerError | None = None

    def step(fn: Callable[[], object]) -> None:
        nonlocal failed
        try:
            fn()
        except DockerError as exc:
            failed = failed or exc

    if containers:
        step(lambda: engine.remove_containers(containers, action=action))
    step(lambda: volumes.extend(project_volumes(engine, name)))
    held = False
    if volumes:
        try:
            engine.remove_volumes(volumes, action=action)
        except VolumeInUse:  # by a container not of this project: trying again cannot help
            held = True
            log.warning(
                "%s: a volume labelled with it is in use by a container of another project; "
                "it stays, listed as this environment's, until a reap or `orchestrator down` "
                "finds it free",
                name,
            )
        except DockerError as exc:
            failed = failed or exc
    if networks:
        step(lambda: _remove_networks(engine, networks))
    return (len(volumes) if failed is None and not held else 0), failed


def project_volumes(engine: Engine, name: str) -> list[str]:
    """The names of the volumes carrying project label `name`."""
    return engine.ids(
        "volume", label=f"{LABEL_PROJECT}={name}", action=f"listing the volumes of {name}"
    )


def _remove_networks(engine: Engine, networks: list[str]) -> None:
    """Remove our networks; one a container of someone else's has joined (which holds it
    in use) has that container disconnected first, and an endpoint the engine left behind
    without its container is disconnected by its name: the network is ours to remove."""
    removing = f"removing networks {' '.join(networks)}"
    try:
        engine.remove_networks(networks, action=removing)
    except NetworkInUse:
        for net in networks:
            with contextlib.suppress(DockerError):  # removed meanwhile
                for joined in engine.joined(net):
                    engine.disconnect(net, joined)
        engine.remove_networks(networks, action=removing)
