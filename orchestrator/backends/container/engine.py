"""python-on-whales clients and errors converted at the boundary."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from python_on_whales import Container, DockerClient
from python_on_whales.exceptions import DockerException
from python_on_whales.utils import run

from orchestrator import settings
from orchestrator.backends.container.layout import FORWARDS_LABEL, parse_forwards
from orchestrator.errors import BackendUnavailable, DockerError, OrchestratorError
from orchestrator.settings import engine_host
from orchestrator.spec.models import Protocol, PublishedPort

T = TypeVar("T")

DAEMON_DOWN = (
    "cannot connect to the docker daemon",
    "failed to connect to the docker api",
    "is the docker daemon running",
)


ENGINE_TIMEOUT_ENV = "ORCHESTRATOR_ENGINE_TIMEOUT"
UP_TIMEOUT_ENV = "ORCHESTRATOR_UP_TIMEOUT"
TIMED_OUT = 124
"""Exit status of coreutils `timeout` when the bound was reached."""


def engine_timeout(name: str = ENGINE_TIMEOUT_ENV, default: float = 120.0) -> float:
    return settings.number(name, default)


def up_timeout() -> float:
    """Bound of `compose up`, which may build images (ORCHESTRATOR_UP_TIMEOUT, 900 s)."""
    return engine_timeout(UP_TIMEOUT_ENV, 900.0)


def is_remote(host: str) -> bool:
    """Whether an engine address may be another machine, whose folders are not ours to
    bind-mount (every address but a local socket)."""
    return bool(host) and not host.startswith(("unix://", "npipe://"))


def docker_client(timeout: float | None = None, **kwargs: Any) -> DockerClient:
    """A client whose every call is bounded: the docker CLI runs under coreutils `timeout`
    (its own process group, so a hung Compose plugin dies with it; status 124) where that
    program exists. Long-lived calls (`docker exec -i` of the executor) use `raw_docker`."""
    bound = engine_timeout() if timeout is None else timeout
    if "host" not in kwargs and (host := engine_host()):
        kwargs["host"] = host  # fixed now: later calls reach the same engine whatever happens
    call = ["docker"]
    if shutil.which("timeout"):
        call = ["timeout", "-k", "5", f"{bound:g}", "docker"]
    return DockerClient(client_call=call, **kwargs)


def raw_docker(client: DockerClient) -> list[str]:
    """The client's docker command without the time bound, for calls that last."""
    cmd = [str(c) for c in client.client_config.docker_cmd]
    if cmd and Path(cmd[0]).name == "timeout":
        cmd = cmd[4:]  # timeout -k 5 SECONDS docker ...
    return cmd


def engine_call(action: str, fn: Callable[[], T], *, retry: bool = True) -> T:
    """Run one engine call, converting its errors; when it timed out and is idempotent
    (`retry`), try once more (hung engine calls happen, rarely)."""
    for attempt in (0, 1):
        try:
            with docker_errors(action):
                return fn()
        except DockerError as exc:
            if not (retry and attempt == 0 and exc.returncode == TIMED_OUT):
                raise
    raise AssertionError("unreachable")


LIST_TRIES = 5
"""Listings made while the engine removes one of the objects it lists can fail over it;
they are made again, this many times at most."""


def listing(
    action: str, argv: list[str], gone: tuple[type[DockerError], ...], *, retry: bool = True
) -> str:
    """The output of one `docker ... ls` call, made again (a moment later, LIST_TRIES times
    at most) when the engine fails it over an object of a kind in `gone` removed while it
    listed (Docker so trips over containers and networks, Podman over images)."""
    for attempt in range(LIST_TRIES):
        try:
            return str(engine_call(action, lambda: run(argv), retry=retry) or "")
        except gone:
            if attempt == LIST_TRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


class NoSuchContainer(DockerError):
    """The engine has no such container (removed, or never made)."""


class ContainerNotRunning(DockerError):
    """The container exists but is stopped (exited, killed, never started)."""


class ContainerPaused(DockerError):
    """The container is paused: nothing can be run in it until it is unpaused."""


class NoSuchImage(DockerError):
    """The engine has no such image."""


class NoSuchNetwork(DockerError):
    """The engine has no such network."""


class NetworkInUse(DockerError):
    """A network cannot be removed while a container still uses it."""


class SubnetOverlap(DockerError):
    """The subnet asked for a network overlaps one the engine already has."""


class NotSwarmManager(DockerError):
    """The engine is not a Swarm manager (no swarm, or a worker)."""


class StorageOptUnsupported(DockerError):
    """The engine's storage driver cannot limit a container's disk (--storage-opt size)."""


class StackEmpty(DockerError):
    """The stack has no task (yet: just deployed; or it is gone)."""


class FreezerBusy(DockerError):
    """The cgroup freezer gave up on a pause (processes forking as it froze them)."""


# The engine's own words for each kind, lower-cased. Order matters: a message may quote
# another ("Cannot kill container: X: No such container: X" is NoSuchContainer), so the
# first kind whose words are found wins. This is the one place engine text is read.
KINDS: tuple[tuple[type[DockerError], tuple[str, ...]], ...] = (
    (NoSuchContainer, ("no such container", "no such object")),
    (ContainerPaused, ("is paused, unpause",)),
    (ContainerNotRunning, ("is not running",)),
    (NoSuchImage, ("no such image", "image not known")),  # (the second: Podman's)
    (NoSuchNetwork, ("no such network", "network not found")),
    (NetworkInUse, ("has active endpoints",)),
    (SubnetOverlap, ("pool overlaps", "overlapping ipv4", "overlaps with other")),
    (NotSwarmManager, ("not a swarm manager", "this node is not a swarm")),
    (StorageOptUnsupported, ("storage-opt",)),
    (StackEmpty, ("nothing found in stack",)),
    (FreezerBusy, ("unable to freeze",)),
)
UNKNOWN_USER = re.compile(r"unable to find (?:user|group) [^\n]*", re.IGNORECASE)
"""What runc says, as a command's own stderr (exit 126), when the exec's user is not in the
image's passwd or group file."""


def classify(stderr: str) -> type[DockerError]:
    """The error type the engine's message stands for (DockerError when none fits)."""
    lowered = stderr.lower()
    for kind, words in KINDS:
        if any(word in lowered for word in words):
            return kind
    return DockerError


def unknown_user(stderr: str) -> str | None:
    """The engine's words when an exec failed because its user is not in the image."""
    found = UNKNOWN_USER.search(stderr)
    return found.group(0) if found else None


def wrap(action: str, exc: DockerException) -> OrchestratorError:
    """A python-on-whales error as ours, keeping exit code and stderr, typed by what the
    engine said (see `classify`)."""
    stderr = (exc.stderr or "") if isinstance(exc.stderr, str) else ""
    text = stderr + (exc.stdout or "" if isinstance(exc.stdout, str) else "")
    lowered = text.lower()
    if any(sign in lowered for sign in DAEMON_DOWN):
        return BackendUnavailable(
            "the Docker engine is not reachable: start it (Docker Desktop, "
            "or `dockerd`; on our machines run scripts/bootstrap-docker)"
        )
    if exc.return_code == TIMED_OUT:
        action += " timed out (the engine did not answer in time; see ORCHESTRATOR_*_TIMEOUT)"
    else:
        action += f" failed (exit {exc.return_code})"
    return classify(text)(
        action,
        command=[str(c) for c in exc.docker_command],
        returncode=exc.return_code,
        stderr=stderr,
    )


def run_cli(action: str, argv: list[str], bound: float | None = None) -> str:
    """One docker CLI call as a plain subprocess (its stdout), for hot paths where
    python-on-whales' wrapper costs a third more; under coreutils `timeout` where that
    program exists (`bound`, else ORCHESTRATOR_ENGINE_TIMEOUT), and typed like every engine
    error."""
    bound = engine_timeout() if bound is None else bound
    if shutil.which("timeout") is not None:
        argv = ["timeout", "-k", "5", f"{bound:g}", *argv]
    with docker_errors(action):
        try:
            done = subprocess.run(argv, capture_output=True, timeout=bound + 10)
        except subprocess.TimeoutExpired:
            raise DockerException(argv, TIMED_OUT, b"", b"") from None
        if done.returncode != 0:
            raise DockerException(argv, done.returncode, done.stdout, done.stderr)
        return done.stdout.decode("utf-8", "replace")


@contextmanager
def docker_errors(action: str) -> Iterator[None]:
    try:
        yield
    except DockerException as exc:
        raise wrap(action, exc) from exc
    except FileNotFoundError as exc:
        raise BackendUnavailable(
            "the docker CLI is not installed (see `orchestrator doctor`)"
        ) from exc


def runtimes(client: DockerClient) -> dict[str, list[str]]:
    """The engine's runtimes and the arguments each is registered with (`docker info`)."""
    text = run_cli(
        "asking the engine for its runtimes",
        [*raw_docker(client), "info", "--format", "{{json .Runtimes}}"],
    )
    try:
        listed = json.loads(text or "{}")
    except ValueError:
        listed = {}
    return {
        str(name): [str(a) for a in (spec or {}).get("runtimeArgs") or []]
        for name, spec in (listed if isinstance(listed, dict) else {}).items()
    }


COMPOSE_SERVICE = "com.docker.compose.service"


def service_of(labels: Mapping[str, str] | None, default: str = "") -> str:
    """The Compose service a container belongs to, from its labels."""
    return (labels or {}).get(COMPOSE_SERVICE, default)


def published_ports(containers: Iterable[Container]) -> list[PublishedPort]:
    """Published ports of containers, with ephemeral host ports resolved; a port the
    environment's forwarder publishes is reported as the container port it stands for."""
    out = []
    for c in containers:
        labels = c.config.labels or {}
        service = service_of(labels, c.name)
        forwards = parse_forwards(labels.get(FORWARDS_LABEL, ""))
        for key, binds in sorted((c.network_settings.ports or {}).items()):
            port, _, proto = key.partition("/")
            owner, target = forwards.get((int(port), proto), (service, int(port)))
            out += [
                PublishedPort(
                    owner,
                    target,
                    cast(Protocol, proto),
                    b.get("HostIp", ""),
                    int(b["HostPort"]),
                )
                for b in binds or []
            ]
    return out


def component_names(client: DockerClient) -> list[str]:
    """The names of the engine's components, as its `docker version` lists them."""
    server = engine_call("asking what the engine is", lambda: client.version().server)
    return [str(c.name or "") for c in (server.components or [])] if server else []
