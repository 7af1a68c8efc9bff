"""Engine errors are typed once, in backends/container/engine.py, from the engine's own words
(as python-on-whales does); everywhere else catches types. The messages below are what a
Docker 20.10 engine and CLI print (captured from the test machine's engine)."""

from __future__ import annotations

import pytest
from python_on_whales.exceptions import DockerException

from orchestrator.backends.container.engine import (
    ContainerNotRunning,
    ContainerPaused,
    NetworkInUse,
    NoSuchContainer,
    NoSuchImage,
    NoSuchNetwork,
    NotSwarmManager,
    StorageOptUnsupported,
    SubnetOverlap,
    classify,
    unknown_user,
    wrap,
)
from orchestrator.errors import BackendUnavailable, DockerError

CID = "37256ffbb1403974e9e2e5ddb0f7a46851aba57e2fe61782e582a26c5e48a900"
REAL = [
    (f"Error response from daemon: No such container: {CID}", NoSuchContainer),
    (f"Error: No such object: {CID}", NoSuchContainer),
    (
        f"Error response from daemon: Cannot kill container: {CID}: No such container: {CID}",
        NoSuchContainer,
    ),
    (f"Error response from daemon: Container {CID} is not running", ContainerNotRunning),
    (
        f"Error response from daemon: Cannot kill container: {CID}: Container {CID} is not running",
        ContainerNotRunning,
    ),
    (
        f"Error response from daemon: Container {CID} is paused, unpause the container before exec",
        ContainerPaused,
    ),
    ("Error response from daemon: No such image: orchestrator-snapshot:nonexist", NoSuchImage),
    (
        "Error response from daemon: no such image: orchestrator-snapshot:nonexist: No such "
        "image: orchestrator-snapshot:nonexist",
        NoSuchImage,
    ),
    (  # Podman, listing images while one is removed (4.3)
        'Error response from daemon: locating image with ID "22119ea2c400": image not known',
        NoSuchImage,
    ),
    ("Error: No such network: orch-x-12345678_default", NoSuchNetwork),
    (
        "Error response from daemon: error while removing network: network orch-x_default id "
        "0a1b has active endpoints",
        NetworkInUse,
    ),
    (
        "failed to create network orch-x_default: Error response from daemon: invalid pool "
        "request: Pool overlaps with other one on this address space",
        SubnetOverlap,
    ),
    (
        "Error response from daemon: networks have overlapping IPv4",
        SubnetOverlap,
    ),
    (
        'this node is not a swarm manager. Use "docker swarm init" or "docker swarm join" to '
        "connect this node to swarm and try again",
        NotSwarmManager,
    ),
    (
        "Error response from daemon: --storage-opt is supported only for overlay over xfs "
        "with 'pquota' mount option",
        StorageOptUnsupported,
    ),
    ("Error response from daemon: conflict: unable to remove repository reference", DockerError),
]


@pytest.mark.parametrize(("stderr", "kind"), REAL)
def test_real_engine_messages_become_their_type(stderr: str, kind: type[DockerError]) -> None:
    assert classify(stderr) is kind
    err = wrap("doing it", DockerException(["docker", "x"], 1, b"", stderr.encode()))
    assert type(err) is kind and isinstance(err, DockerError)  # old `except`s still match
    assert err.stderr == stderr and err.returncode == 1 and "doing it failed" in str(err)


def test_a_daemon_that_is_down_stays_backend_unavailable() -> None:
    said = b"Cannot connect to the Docker daemon at unix:///var/run/docker.sock."
    assert isinstance(wrap("x", DockerException(["docker"], 1, b"", said)), BackendUnavailable)


def test_an_unknown_user_is_read_from_the_exec_s_own_words() -> None:
    said = "unable to find user nobody2: no matching entries in passwd file\n"
    assert unknown_user(said) == said.strip()
    assert unknown_user("sh: 1: nope: not found") is None
