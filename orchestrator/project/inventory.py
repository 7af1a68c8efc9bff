"""Find our projects by label, and remove them by id (never by a broad filter)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_on_whales import DockerClient

from orchestrator.compile.render import MAIN, USER_LABEL
from orchestrator.errors import ProjectNotFound
from orchestrator.project.engine import docker_client, docker_errors, service_of
from orchestrator.project.identity import (
    DETACHED,
    LABEL_DIR,
    LABEL_ENV,
    LABEL_MANAGED,
    LABEL_OWNER_HOST,
    LABEL_OWNER_PID,
    LABEL_PROJECT,
    LABEL_STARTED,
    owner_alive,
    state_dir,
)


@dataclass
class ProjectInfo:
    name: str
    labels: dict[str, str]
    containers: list[tuple[str, str, str]]
    """(id, service, state)"""
    networks: list[str]
    main_user: str = ""
    """The user commands run as in the main container ("uid:gid"; "" if unknown)."""

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
            service = service_of(labels)
            info.containers.append((c.id[:12], service, c.state.status or ""))
            if service == MAIN:
                info.main_user = labels.get(USER_LABEL, "")
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
    """Remove a project by the ids already listed for it, then its folder."""
    containers = [cid for cid, _, _ in info.containers]
    _remove(client or docker_client(), info.name, containers, info.networks)
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
    with docker_errors(f"listing project {name}"):
        containers = [c.id for c in client.container.list(all=True, filters=flt)]
        networks = [n.id for n in client.network.list(filters=flt)]
    return _remove(client, name, containers, networks)


def _remove(client: DockerClient, name: str, containers: list[str], networks: list[str]) -> int:
    """Remove these containers and networks, and the volumes labelled with the project."""
    flt: Any = [("label", f"{LABEL_PROJECT}={name}")]
    with docker_errors(f"removing project {name}"):
        if containers:
            client.container.remove(containers, force=True, volumes=True)
        if networks:  # the stub asks for list[Network | str]; a list of ids is what we have
            client.network.remove(networks)  # type: ignore[arg-type]
        volumes: Any = [v.name for v in client.volume.list(filters=flt)]
        if volumes:
            client.volume.remove(volumes)
    return len(containers) + len(networks) + len(volumes)
