"""Engine clients, calls bounded in time, and errors converted at the boundary.

python-on-whales is imported on a client's first use of its API, never before: importing it
costs a process about a third of a second of CPU, which `orchestrator ps` and `exec` (plain
docker CLI calls and the executor's channel) never need to pay."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, Union, cast

from orchestrator import settings
from orchestrator.backends.container.layout import FORWARDS_LABEL, parse_forwards
from orchestrator.errors import BackendUnavailable, DockerError, OrchestratorError
from orchestrator.settings import engine_host
from orchestrator.spec.models import Protocol, PublishedPort

if TYPE_CHECKING:
    from python_on_whales import Container, DockerClient
    from python_on_whales.components.compose.cli_wrapper import ComposeCLI
    from python_on_whales.components.container.cli_wrapper import ContainerCLI
    from python_on_whales.components.image.cli_wrapper import ImageCLI
    from python_on_whales.components.network.cli_wrapper import NetworkCLI
    from python_on_whales.components.volume.cli_wrapper import VolumeCLI
    from python_on_whales.exceptions import DockerException

T = TypeVar("T")

DAEMON_DOWN = (
    "cannot connect to the docker daemon",
    "failed to connect to the docker api",
    "is the docker daemon running",
)


ENGINE_TIMEOUT_ENV = settings.ENGINE_TIMEOUT.name
UP_TIMEOUT_ENV = settings.UP_TIMEOUT.name
TIMED_OUT = 124
"""Exit status of coreutils `timeout` when the bound was reached."""


def engine_timeout() -> float:
    return settings.ENGINE_TIMEOUT.get()


def up_timeout() -> float:
    """Bound of `compose up`, which may build images (ORCHESTRATOR_UP_TIMEOUT, 900 s)."""
    return settings.UP_TIMEOUT.get()


def is_remote(host: str) -> bool:
    """Whether an engine address may be another machine, whose folders are not ours to
    bind-mount (every address but a local socket)."""
    return bool(host) and not host.startswith(("unix://", "npipe://"))


class Client:
    """One engine: its address, the docker command that bounds each call, and
    python-on-whales' client for it (`whales`), made when its API is first used."""

    def __init__(self, call: list[str], host: str = "", **compose: Any) -> None:
        self.host = host
        """The engine's address ("": the docker CLI's default)."""
        self._call = call
        self._compose = compose

    @property
    def docker_cmd(self) -> list[str]:
        """The docker command, bounded in time (see `docker_client`)."""
        return [*self._call, *(["--host", self.host] if self.host else [])]

    @property
    def raw_cmd(self) -> list[str]:
        """The docker command without the time bound, for calls that last."""
        cmd = self.docker_cmd
        if cmd and Path(cmd[0]).name == "timeout":
            cmd = cmd[4:]  # timeout -k 5 SECONDS docker ...
        return cmd

    @cached_property
    def whales(self) -> DockerClient:
        from python_on_whales import DockerClient

        return DockerClient(client_call=self._call, host=self.host or None, **self._compose)

    @property
    def container(self) -> ContainerCLI:
        return self.whales.container

    @property
    def compose(self) -> ComposeCLI:
        return self.whales.compose

    @property
    def image(self) -> ImageCLI:
        return self.whales.image

    @property
    def network(self) -> NetworkCLI:
        return self.whales.network

    @property
    def volume(self) -> VolumeCLI:
        return self.whales.volume


def docker_client(timeout: float | None = None, *, host: str = "", **compose: Any) -> Client:
    """A client whose every call is bounded: the docker CLI runs under coreutils `timeout`
    (its own process group, so a hung Compose plugin dies with it; status 124) where that
    program exists. Long-lived calls (`docker exec -i` of the executor) use `raw_cmd`."""
    bound = engine_timeout() if timeout is None else timeout
    host = host or engine_host()  # fixed now: later calls reach the same engine whatever happens
    call = ["docker"]
    if shutil.which("timeout"):
        call = ["timeout", "-k", "5", f"{bound:g}", "docker"]
    return Client(call, host, **compose)


class CallFailed(Exception):
    """A docker CLI call that exited non-zero (or timed out: TIMED_OUT), with what it
    printed; the same fields as python-on-whales' DockerException, without importing it."""

    def __init__(
        self,
        argv: Sequence[str | Path],
        return_code: int,
        stdout: bytes | str | None = None,
        stderr: bytes | str | None = None,
    ) -> None:
        self.docker_command = [str(a) for a in argv]
        self.return_code = return_code
        self.stdout = _text(stdout)
        self.stderr = _text(stderr)
        super().__init__(
            f"`{shlex.join(self.docker_command)}` exited {return_code}: {self.stderr or ''}"
        )


def _text(data: bytes | str | None) -> str | None:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


Failure = Union["DockerException", CallFailed]
"""A failed engine call, as python-on-whales' API or our `run` reports it."""


def run(
    argv: Sequence[str | Path], *, input: bytes | None = None, backstop: float | None = None
) -> str:
    """One docker CLI call (`argv`, bounded as the client's `docker_cmd` is): its stdout, one
    trailing newline dropped; CallFailed when it exits non-zero. A call under `timeout` is
    also abandoned shortly after that bound (or after `backstop` seconds, when given),
    should a process it left behind hold its output open; either way, and when `timeout`
    had to KILL it, the failure is TIMED_OUT."""
    args = [str(a) for a in argv]
    bounded = _bound_of(args)
    limit = backstop if backstop is not None else bounded
    try:
        done = subprocess.run(args, input=input, capture_output=True, timeout=limit)
    except subprocess.TimeoutExpired:
        raise CallFailed(args, TIMED_OUT, b"", b"") from None
    if done.returncode != 0:
        killed = bounded is not None and done.returncode in KILLED
        code = TIMED_OUT if killed else done.returncode
        raise CallFailed(args, code, done.stdout, done.stderr)
    out = done.stdout.decode("utf-8", "replace")
    return out[:-1] if out.endswith("\n") else out


KILLED = (128 + 9, -9)
"""How a call ends that coreutils `timeout` had to KILL: 137, or -9 when `timeout` (which
signals its whole process group) went with it."""


def _bound_of(args: list[str]) -> float | None:
    """Seconds after which a call made under coreutils `timeout -k GRACE SECONDS` is given
    up: its bound, its grace and five more; None for a call not so made."""
    if len(args) > 4 and Path(args[0]).name == "timeout" and args[1] == "-k":
        try:
            return float(args[3]) + float(args[2]) + 5
        except ValueError:
            return None
    return None


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


class NoSuchVolume(DockerError):
    """The engine has no such volume."""


class NetworkInUse(DockerError):
    """A network cannot be removed while a container still uses it."""


class SubnetOverlap(DockerError):
    """The subnet asked for a network overlaps one the engine already has."""


class NotSwarmManager(DockerError):
    """The engine is not a Swarm manager (no swarm, or a worker)."""


class VolumeInUse(DockerError):
    """A volume a container still mounts (on a shared engine: possibly someone else's)."""


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
    (NoSuchVolume, ("no such volume", "no volume with name")),  # (the second: Podman's)
    (NetworkInUse, ("has active endpoints",)),
    (VolumeInUse, ("volume is in use", "volume is being used")),  # (the second: Podman's)
    (SubnetOverlap, ("pool overlaps", "overlapping ipv4", "overlaps with other")),
    (NotSwarmManager, ("not a swarm manager", "this node is not a swarm")),
    (StorageOptUnsupported, ("storage-opt",)),
    (StackEmpty, ("nothing found in stack",)),
    (FreezerBusy, ("unable to freeze",)),
)
UNKNOWN_USER = re.compile(
    r"unable to find (?:user|group) [^\n]*|(?:uid|gid) \d+ is out of range[^\n]*"
    r"|uids and gids must be in range[^\n]*",
    re.IGNORECASE,
)
"""What runc says, as a command's own stderr (exit 126), when the exec's user is not in the
image's passwd or group file, or an id there is out of its range; or the executor, when an
id there is out of range."""


_NAMED_NOT_FOUND = re.compile(r"\bnetwork \S+ not found")
"""The engine's other words for a missing network ("network NAME not found")."""


def classify(stderr: str) -> type[DockerError]:
    """The error type the engine's message stands for (DockerError when none fits)."""
    lowered = stderr.lower()
    for kind, words in KINDS:
        if any(word in lowered for word in words):
            return kind
    if _NAMED_NOT_FOUND.search(lowered):
        return NoSuchNetwork
    return DockerError


def unknown_user(stderr: str) -> str | None:
    """The engine's words when an exec failed because its user is not in the image."""
    found = UNKNOWN_USER.search(stderr)
    return found.group(0) if found else None


def wrap(action: str, exc: Failure) -> OrchestratorError:
    """A failed engine call as ours, keeping exit code and stderr, typed by what the
    engine said (see `classify`)."""
    stderr = (exc.stderr or "") if isinstance(exc.stderr, str) else ""
    text = stderr + (exc.stdout or "" if isinstance(exc.stdout, str) else "")
    lowered = text.lower()
    if any(sign in lowered for sign in DAEMON_DOWN):
        return BackendUnavailable(
            "the Docker engine is not reachable: start it (Docker Desktop, "
            "or `dockerd`; on our machines run scripts/bootstrap-docker)"
        )
    command = [str(c) for c in exc.docker_command]
    code = exc.return_code
    if code in KILLED and _bound_of(command) is not None:  # `timeout` had to KILL it
        code = TIMED_OUT
    if code == TIMED_OUT:
        action += " timed out (the engine did not answer in time; see ORCHESTRATOR_*_TIMEOUT)"
    else:
        action += f" failed (exit {code})"
    return classify(text)(action, command=command, returncode=code, stderr=stderr)


def run_cli(action: str, argv: list[str], bound: float | None = None) -> str:
    """One docker CLI call as a plain subprocess (its stdout), for hot paths where
    python-on-whales' wrapper costs a third more; under coreutils `timeout` where that
    program exists (`bound`, else ORCHESTRATOR_ENGINE_TIMEOUT), and typed like every engine
    error."""
    bound = engine_timeout() if bound is None else bound
    if shutil.which("timeout") is not None:
        argv = ["timeout", "-k", "5", f"{bound:g}", *argv]
    with docker_errors(action):
        return run(argv, backstop=bound + 10)


@contextmanager
def docker_errors(action: str) -> Iterator[None]:
    try:
        yield
    except CallFailed as exc:
        raise wrap(action, exc) from exc
    except FileNotFoundError as exc:
        raise BackendUnavailable(
            "the docker CLI is not installed (see `orchestrator doctor`)"
        ) from exc
    except UnicodeDecodeError as exc:  # python-on-whales decodes what the CLI said strictly
        raise DockerError(f"{action} failed: the engine's answer is not UTF-8 ({exc})") from exc
    except Exception as exc:
        if not is_whales_error(exc):
            raise
        raise wrap(action, cast("DockerException", exc)) from exc


def is_whales_error(exc: BaseException) -> bool:
    """Whether `exc` is python-on-whales' DockerException (none can be before it is
    imported: it is not imported here for this)."""
    module = sys.modules.get("python_on_whales.exceptions")
    return module is not None and isinstance(exc, module.DockerException)


def runtimes(client: Client) -> dict[str, list[str]]:
    """The engine's runtimes and the arguments each is registered with (`docker info`)."""
    text = run_cli(
        "asking the engine for its runtimes",
        [*client.raw_cmd, "info", "--format", "{{json .Runtimes}}"],
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


def component_names(client: Client) -> list[str]:
    """The names of the engine's components, as its `docker version` lists them."""
    server = engine_call("asking what the engine is", lambda: client.whales.version().server)
    return [str(c.name or "") for c in (server.components or [])] if server else []
