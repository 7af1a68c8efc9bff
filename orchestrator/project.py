"""The deployment layer: compile an environment into a Compose project on disk, bring it up
with a per-project python-on-whales client, find our projects by label, take them down, and
reap the ones whose owner is gone. Knows nothing of how commands run."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException

from orchestrator.compile.render import MAIN, CompiledProject, CompileOptions, compile_project
from orchestrator.errors import (
    BackendUnavailable,
    DockerError,
    HealthcheckFailed,
    OrchestratorError,
    ProjectNotFound,
    StartupError,
)
from orchestrator.spec.loader import Environment

L = "org.orchestrator."
LABEL_MANAGED = L + "managed"
LABEL_PROJECT = L + "project"
LABEL_ENV = L + "env"
LABEL_DIGEST = L + "digest"
LABEL_OWNER_PID = L + "owner.pid"
LABEL_OWNER_START = L + "owner.start"
LABEL_OWNER_HOST = L + "owner.host"
LABEL_STARTED = L + "started"
LABEL_DIR = L + "dir"
DETACHED = "0"
"""Owner pid of a project started by `orchestrator up`: it lives until `down` or `cleanup --all`."""

POOL_ENV = "ORCHESTRATOR_SUBNET_POOL"
PREFIX_ENV = "ORCHESTRATOR_SUBNET_PREFIX"
DEFAULT_POOL = "10.213.0.0/16"
DEFAULT_PREFIX = 27
STOP_TIMEOUT = 2

T = TypeVar("T")


def state_dir() -> Path:
    """Where project folders live: $ORCHESTRATOR_STATE_DIR, else $XDG_STATE_HOME/orchestrator."""
    explicit = os.environ.get("ORCHESTRATOR_STATE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "orchestrator"


def _process_start(pid: int) -> str:
    """Start time of a process in clock ticks since boot ('' where /proc is absent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return ""
    return stat[stat.rfind(b")") + 2 :].split()[19].decode()


def owner_alive(labels: dict[str, str]) -> bool:
    """Whether the process that owns a project still runs (detached projects count as alive)."""
    pid = labels.get(LABEL_OWNER_PID, DETACHED)
    if pid == DETACHED or labels.get(LABEL_OWNER_HOST) != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    start = labels.get(LABEL_OWNER_START, "")
    return not start or _process_start(int(pid)) in ("", start)


def project_name(env_name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in env_name.lower())[:30]
    return f"orch-{safe}-{uuid.uuid4().hex[:8]}"


def project_labels(env: Environment, name: str, directory: Path, detached: bool) -> dict[str, str]:
    pid = os.getpid()
    return {
        LABEL_MANAGED: "1",
        LABEL_PROJECT: name,
        LABEL_ENV: env.name,
        LABEL_DIGEST: env.digest,
        LABEL_OWNER_PID: DETACHED if detached else str(pid),
        LABEL_OWNER_START: "" if detached else _process_start(pid),
        LABEL_OWNER_HOST: socket.gethostname(),
        LABEL_STARTED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        LABEL_DIR: str(directory),
    }


def pick_subnet(rng: random.Random | None = None) -> str:
    """A random small subnet from our pool. Docker's default address pools hold only ~30
    networks; giving each project an explicit subnet from a large pool of our own lifts that
    limit. Collisions with a live network are retried by the caller."""
    pool = ipaddress.ip_network(os.environ.get(POOL_ENV, DEFAULT_POOL))
    prefix = int(os.environ.get(PREFIX_ENV, DEFAULT_PREFIX))
    count = 2 ** (prefix - pool.prefixlen)
    index = (rng or random.SystemRandom()).randrange(count)
    size = 2 ** (pool.max_prefixlen - prefix)
    return str(ipaddress.ip_network((int(pool.network_address) + index * size, prefix)))


def docker_client(**kwargs: Any) -> DockerClient:
    return DockerClient(**kwargs)


def wrap(action: str, exc: DockerException) -> OrchestratorError:
    """A python-on-whales error as ours, keeping exit code and stderr."""
    stderr = (exc.stderr or "") if isinstance(exc.stderr, str) else ""
    text = stderr + (exc.stdout or "" if isinstance(exc.stdout, str) else "")
    if "Cannot connect to the Docker daemon" in text or "docker daemon running" in text:
        return BackendUnavailable(
            "the Docker engine is not reachable: start it (Docker Desktop, "
            "or `dockerd`; on our machines run scripts/bootstrap-docker)"
        )
    return DockerError(
        f"{action} failed (exit {exc.return_code})",
        command=[str(c) for c in exc.docker_command],
        returncode=exc.return_code,
        stderr=stderr,
    )


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


@dataclass
class Project:
    """One compose project on disk and, once up, in the engine."""

    name: str
    directory: Path
    compiled: CompiledProject | None = None
    client: DockerClient = field(init=False)

    def __post_init__(self) -> None:
        compose = self.directory / "compose.yaml"
        self.client = docker_client(
            compose_files=[compose],
            compose_project_name=self.name,
            compose_project_directory=self.directory,
        )

    @property
    def main_container(self) -> str:
        return f"{self.name}-{MAIN}-1"

    def up(self) -> None:
        with docker_errors(f"starting project {self.name}"):
            self.client.compose.up(detach=True, quiet=True)

    def down(self, keep: bool = False) -> None:
        """Remove containers, networks and volumes (or only stop them with keep=True)."""
        with docker_errors(f"removing project {self.name}"):
            if keep:
                self.client.compose.stop(timeout=STOP_TIMEOUT)
            else:
                self.client.compose.down(
                    remove_orphans=True, volumes=True, timeout=STOP_TIMEOUT, quiet=True
                )
        if not keep:
            shutil.rmtree(self.directory, ignore_errors=True)

    def kill(self) -> None:
        with docker_errors(f"killing project {self.name}"):
            self.client.compose.kill()

    def ports(self) -> list[dict[str, Any]]:
        """Published ports as [{service, container, protocol, host_ip, host}] (ephemeral ones
        resolved)."""
        out = []
        with docker_errors("reading published ports"):
            for c in self.client.compose.ps():
                service = (c.config.labels or {}).get("com.docker.compose.service", c.name)
                for key, binds in sorted((c.network_settings.ports or {}).items()):
                    port, _, proto = key.partition("/")
                    for b in binds or []:
                        out.append(
                            {
                                "service": service,
                                "container": int(port),
                                "protocol": proto,
                                "host_ip": b.get("HostIp", ""),
                                "host": int(b["HostPort"]),
                            }
                        )
        return out

    def service_states(self) -> list[tuple[str, str, str]]:
        """(service, state, health) for every container of the project."""
        with docker_errors("listing project containers"):
            containers = self.client.compose.ps(all=True)
        out = []
        for c in containers:
            service = (c.config.labels or {}).get("com.docker.compose.service", c.name)
            health = c.state.health.status if c.state.health else ""
            out.append((service, c.state.status or "", health or ""))
        return out

    def logs(self, service: str | None = None, tail: int | None = None) -> str:
        with docker_errors("reading logs"):
            text = self.client.compose.logs(
                services=[service] if service else [], tail=str(tail) if tail else None
            )
        return text if isinstance(text, str) else ""


def _retry_subnet(attempt: Callable[[], T], tries: int = 8) -> T:
    for i in range(tries):
        try:
            return attempt()
        except DockerError as exc:
            overlap = "overlaps" in exc.stderr or "overlapping" in exc.stderr
            if not overlap or i == tries - 1:
                raise
    raise AssertionError("unreachable")


def start_project(
    env: Environment,
    make_options: Callable[[str, dict[str, str], str | None], CompileOptions],
    *,
    detached: bool = False,
    extra_files: dict[str, bytes] | None = None,
) -> Project:
    """Compile, write and bring up a project; on any failure remove everything it created."""
    name = project_name(env.name)
    directory = state_dir() / "projects" / name
    labels = project_labels(env, name, directory, detached)
    compiled = compile_project(env, make_options(name, labels, None))  # spec errors: nothing made
    project = Project(name, directory, compiled)

    def attempt() -> Project:
        subnet = pick_subnet() if compiled.has_network else None
        project.compiled = compile_project(env, make_options(name, labels, subnet))
        project.compiled.write(directory)
        for rel, data in (extra_files or {}).items():
            (directory / rel).write_bytes(data)
        try:
            project.up()
        except DockerError as exc:
            err = _diagnose(project, exc)
            _remove_quietly(project)
            if err is exc:
                raise
            raise err from exc
        return project

    try:
        return _retry_subnet(attempt)
    except (DockerError, StartupError):
        raise  # attempt() already removed what it made
    except BaseException:  # interrupted mid-start: remove whatever exists
        _remove_quietly(project)
        raise


def _remove_quietly(project: Project) -> None:
    try:
        project.down()
    except OrchestratorError:
        # if the engine is gone too, `orchestrator cleanup` finds the rest by label later
        with contextlib.suppress(OrchestratorError):
            remove_by_label(project.name)
    shutil.rmtree(project.directory, ignore_errors=True)


def _diagnose(project: Project, exc: DockerError) -> OrchestratorError:
    """A failed `up` because a service never became healthy (or died) becomes an error that
    names the service and shows its last log lines."""
    try:
        states = project.service_states()
    except OrchestratorError:
        return exc
    bad = [
        (svc, state, health)
        for svc, state, health in states
        if svc != MAIN and (health == "unhealthy" or state in ("exited", "dead"))
    ]
    if not bad:
        return exc
    parts = []
    for svc, state, health in bad:
        try:
            logs = project.logs(svc, tail=20).strip()
        except OrchestratorError:
            logs = ""
        why = "never became healthy" if health == "unhealthy" else f"stopped ({state})"
        parts.append(f"service {svc!r} {why}; last log lines:\n{logs or '(no output)'}")
    return HealthcheckFailed(f"project {project.name} did not start: " + "\n".join(parts))


@dataclass(frozen=True)
class ProjectInfo:
    name: str
    labels: dict[str, str]
    containers: list[tuple[str, str, str]]
    """(id, service, state)"""
    networks: list[str]

    @property
    def env(self) -> str:
        return self.labels.get(LABEL_ENV, "")

    @property
    def directory(self) -> Path | None:
        d = self.labels.get(LABEL_DIR)
        return Path(d) if d else None

    @property
    def owner(self) -> str:
        pid = self.labels.get(LABEL_OWNER_PID, DETACHED)
        return "detached" if pid == DETACHED else f"pid {pid}@{self.labels.get(LABEL_OWNER_HOST)}"


def list_projects(client: DockerClient | None = None) -> list[ProjectInfo]:
    """Every project carrying our labels, from its containers and networks."""
    client = client or docker_client()
    flt: Any = [("label", f"{LABEL_MANAGED}=1")]
    found: dict[str, ProjectInfo] = {}
    with docker_errors("listing projects"):
        for c in client.container.list(all=True, filters=flt):
            labels = dict(c.config.labels or {})
            name = labels.get(LABEL_PROJECT, "")
            info = found.setdefault(name, ProjectInfo(name, labels, [], []))
            service = labels.get("com.docker.compose.service", "")
            info.containers.append((c.id[:12], service, c.state.status or ""))
        for n in client.network.list(filters=flt):
            labels = dict(n.labels or {})
            name = labels.get(LABEL_PROJECT, "")
            found.setdefault(name, ProjectInfo(name, labels, [], [])).networks.append(n.id[:12])
    return sorted(found.values(), key=lambda p: (p.labels.get(LABEL_STARTED, ""), p.name))


def find_project(ref: str, client: DockerClient | None = None) -> ProjectInfo:
    """A project by full name or unique prefix or suffix (the short id)."""
    projects = list_projects(client)
    exact = [p for p in projects if p.name == ref]
    matches = exact or [p for p in projects if p.name.startswith(ref) or p.name.endswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(p.name for p in projects) or "none running"
        raise ProjectNotFound(f"no environment {ref!r} (known: {known})")
    raise ProjectNotFound(f"{ref!r} matches several: {', '.join(p.name for p in matches)}")


def remove_project(info: ProjectInfo, client: DockerClient | None = None) -> None:
    """Remove a project by the ids of what carries its label, then its folder."""
    remove_by_label(info.name, client)
    if info.directory is not None and info.directory.is_relative_to(state_dir()):
        shutil.rmtree(info.directory, ignore_errors=True)


def reap(all_projects: bool = False, client: DockerClient | None = None) -> list[str]:
    """Remove our projects whose owner process is gone (or all of ours). Never touches
    anything without our labels."""
    removed = []
    for info in list_projects(client):
        if all_projects or not owner_alive(info.labels):
            remove_project(info, client)
            removed.append(info.name)
    return removed


def remove_by_label(name: str, client: DockerClient | None = None) -> int:
    """Remove every container, network and volume carrying project label `name`, by id."""
    client = client or docker_client()
    flt: Any = [("label", f"{LABEL_PROJECT}={name}")]
    removed = 0
    with docker_errors(f"removing project {name}"):
        ids = [c.id for c in client.container.list(all=True, filters=flt)]
        if ids:
            client.container.remove(ids, force=True, volumes=True)
            removed += len(ids)
        nets: Any = [n.id for n in client.network.list(filters=flt)]
        if nets:
            client.network.remove(nets)
            removed += len(nets)
        vols: Any = [v.name for v in client.volume.list(filters=flt)]
        if vols:
            client.volume.remove(vols)
            removed += len(vols)
    return removed
