"""The conformance suite (`orchestrator.testing`) against every built-in backend, and through
both front doors: the blocking API, and `orchestrator.aio` (the `-async` targets, called
through orchestrator.testing.door). `docker-plain` is the Docker backend with the fast
executor switched off, so the fallback path keeps the same rules; `swarm` runs on the test
Swarm of `scripts/cluster` (started for the session if none runs), `docker-remote` is
the Docker backend on the engine of one of its nodes: another engine, whose machine shares
no folder with ours, and `docker-podman` the Docker backend on root Podman's API
(`--engine podman`, started by scripts/bootstrap-podman)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from orchestrator.testing import Target
from orchestrator.testing.conformance import *  # noqa: F403
from tests.conftest import PYTHON_IMAGE, swarm_settings

DOCKER_LINES = (f"image: {PYTHON_IMAGE}", "user: '1000:1000'", "resources: {memory: 1g, pids: 512}")
SIDECARS = PYTHON_IMAGE
TARGETS = [
    Target("local", service_image=SIDECARS),
    Target("docker", env_lines=DOCKER_LINES, default_uid="1000", service_image=SIDECARS),
    Target("local", service_image=SIDECARS, label="local-async", front_door="async"),
    Target(
        "docker",
        env_lines=DOCKER_LINES,
        default_uid="1000",
        service_image=SIDECARS,
        label="docker-async",
        front_door="async",
    ),
    Target(
        "docker",
        env_lines=DOCKER_LINES,
        default_uid="1000",
        process_env={"ORCHESTRATOR_EXEC_MODE": "plain"},
        label="docker-plain",
        service_image=SIDECARS,
        deviations={
            "tty": "a terminal needs the in-container executor: plain `docker exec` refuses "
            "tty=True (UsageError)",
        },
    ),
    Target(
        "docker",
        env_lines=DOCKER_LINES,
        default_uid="1000",
        label="docker-remote",
        service_image=SIDECARS,
    ),
    Target(
        "docker",
        env_lines=(*DOCKER_LINES, "isolation: gvisor"),
        default_uid="1000",
        label="docker-gvisor",
        service_image=SIDECARS,
        keeps=frozenset({"fork-memory"}),  # no network: saved with its memory (runsc-sealed)
        deviations={
            "pause": "gVisor's runsc (2022-12, ptrace) thaws a paused sandbox with its "
            "sleeping processes stuck: pause is refused under gvisor (suspend works)",
            "tty-keys": "gVisor's runsc (2022-12) terminal does not act on the control keys "
            "typed into it (Ctrl-C, Ctrl-D): Process.signal reaches its group, kill ends it",
        },
    ),
    Target(
        "docker",
        env_lines=DOCKER_LINES,
        default_uid="1000",
        label="docker-podman",
        service_image=SIDECARS,
        # Podman cannot take a pinned folder (it fills and re-owns a volume on its first
        # mount): its host folders go by path, which the caller must accept
        process_env={"ORCHESTRATOR_ENGINE": "podman", "ORCHESTRATOR_ALLOW_UNPINNED_MOUNTS": "1"},
        deviations={
            "services": "Podman runs sandboxes without network: a file with services is "
            "refused before anything is made (docs/isolation.md)",
        },
    ),
    Target(
        "swarm",
        env_lines=(f"image: {PYTHON_IMAGE}", "user: '1000:1000'", "resources: {memory: 1g}"),
        default_uid="1000",
        service_image=SIDECARS,
    ),
]


@pytest.fixture(scope="module", params=TARGETS, ids=[t.id for t in TARGETS])
def conformance_target(request: pytest.FixtureRequest) -> Iterator[Target]:
    target: Target = request.param
    if target.id == "docker-gvisor":
        request.getfixturevalue("gvisor_engine")
    if target.id == "docker-remote":  # the Docker backend on another machine's engine
        engine = request.getfixturevalue("remote_engine")
        target = dataclasses.replace(target, process_env={"ORCHESTRATOR_DOCKER_HOST": engine})
    with pytest.MonkeyPatch.context() as patch:
        if target.backend == "swarm":  # the process's Swarm while this target's tests run
            for key, value in swarm_settings(request.getfixturevalue("swarm_manager")).items():
                patch.setenv(key, value)
        yield target
