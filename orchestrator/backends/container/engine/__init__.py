"""The container engine, as one object: `Engine.at(address)` is the only thing in the package
that spells a docker command line or an Engine API path, runs it bounded, and types its
failures. Backends and services take an Engine, never an argv prefix.

    core.py         the Engine itself: address, kind, socket; argv, run, api, exec_target,
                    python-on-whales' client (made on first use)
    containers.py   containers, networks, volumes, images, logs, build, what doctor asks
    sockets.py      the same through the API on this machine's socket (hot paths)
    swarm.py        stacks, tasks and nodes of a Swarm manager
    exec_target.py  `docker exec` command lines (the executor, copy-in, tethers, shells)
    bounds.py       deadlines (ORCHESTRATOR_ENGINE_TIMEOUT, ORCHESTRATOR_UP_TIMEOUT)
    cli.py api.py   running one command line; one API call on a Unix socket
    errors.py       what the engine said, typed once (the one place engine text is read)

A Kubernetes- or containerd-shaped engine would be another class with the same operations."""

from __future__ import annotations

from orchestrator.backends.container.engine.api import ContainerState, EngineFacts, resolved_host
from orchestrator.backends.container.engine.bounds import (
    ENGINE_TIMEOUT_ENV,
    TIMED_OUT,
    UP_TIMEOUT_ENV,
    engine_timeout,
    is_remote,
    up_timeout,
)
from orchestrator.backends.container.engine.cli import engine_call
from orchestrator.backends.container.engine.containers import (
    COMPOSE_SERVICE,
    ContainerOps,
    Kind,
    context_address,
    published_ports,
    service_of,
)
from orchestrator.backends.container.engine.errors import (
    CallFailed,
    ContainerNotRunning,
    ContainerPaused,
    FreezerBusy,
    NetworkAmbiguous,
    NetworkInUse,
    NoSuchContainer,
    NoSuchImage,
    NoSuchNetwork,
    NoSuchVolume,
    NotSwarmManager,
    RemovalInProgress,
    StackEmpty,
    StorageOptUnsupported,
    SubnetOverlap,
    VolumeInUse,
    classify,
    docker_errors,
    exec_impossible,
    exec_refusal,
    exec_refused_as_it_died,
    no_process,
    unknown_user,
    wrap,
)
from orchestrator.backends.container.engine.exec_target import ExecTarget
from orchestrator.backends.container.engine.sockets import SocketOps
from orchestrator.backends.container.engine.swarm import SwarmOps


class Engine(ContainerOps, SocketOps, SwarmOps):
    """One container engine (see the package): `Engine.at(address)`, made once per address
    in a process; a Swarm node's engine is another Engine."""


__all__ = [
    "COMPOSE_SERVICE",
    "ENGINE_TIMEOUT_ENV",
    "TIMED_OUT",
    "UP_TIMEOUT_ENV",
    "CallFailed",
    "ContainerNotRunning",
    "ContainerPaused",
    "ContainerState",
    "Engine",
    "EngineFacts",
    "ExecTarget",
    "FreezerBusy",
    "Kind",
    "NetworkAmbiguous",
    "NetworkInUse",
    "NoSuchContainer",
    "NoSuchImage",
    "NoSuchNetwork",
    "NoSuchVolume",
    "NotSwarmManager",
    "RemovalInProgress",
    "StackEmpty",
    "StorageOptUnsupported",
    "SubnetOverlap",
    "VolumeInUse",
    "classify",
    "context_address",
    "docker_errors",
    "engine_call",
    "engine_timeout",
    "exec_impossible",
    "exec_refusal",
    "exec_refused_as_it_died",
    "is_remote",
    "no_process",
    "published_ports",
    "resolved_host",
    "service_of",
    "unknown_user",
    "up_timeout",
    "wrap",
]
