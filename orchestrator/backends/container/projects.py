"""Our projects as the engine lists them: found by our labels and names in one listing per
kind of object (never inspected afterwards), what their labels may and may not be trusted
with (`ProjectInfo`), claimed from a pool, and removed by the ids listed."""

from __future__ import annotations

import dataclasses
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.backends.container.engine import (
    COMPOSE_SERVICE,
    Engine,
    Kind,
)
from orchestrator.backends.container.identity import (
    DETACHED,
    KEPT_FILE,
    LABEL_DIGEST,
    LABEL_DIR,
    LABEL_ENV,
    LABEL_MANAGED,
    LABEL_OWNER_HOST,
    LABEL_OWNER_PID,
    LABEL_OWNER_START,
    LABEL_PROJECT,
    LABEL_STARTED,
    PROJECT_PREFIX,
    folder_owner,
    is_project_name,
    kept,
    labelled_folder,
    our_folder,
    owner_alive,
)
from orchestrator.backends.container.layout import FORWARDS_LABEL, USER_LABEL, parse_forwards
from orchestrator.backends.container.membership import CLAIMED, READY, move
from orchestrator.backends.container.removal import remove
from orchestrator.errors import ProjectNotFound
from orchestrator.paths import projects_dir
from orchestrator.sandbox.record import match_id
from orchestrator.spec.published import MAIN, PublishedPort
from orchestrator.tables import printable


@dataclass
class ProjectInfo:
    name: str
    labels: dict[str, str]
    containers: list[tuple[str, str, str]]
    """(id, service, state); full ids: the engine takes a name before an id prefix, so a
    short id could name someone else's object"""
    networks: list[str]
    volumes: list[str] = field(default_factory=list)
    main_user: str = ""
    """The user commands run as in the main container ("uid:gid"; "" if unknown)."""
    ports: list[PublishedPort] = field(default_factory=list)
    """Published ports of its containers, as the listing read them."""
    owners: dict[tuple[tuple[str, str], ...], dict[str, str]] = field(default_factory=dict)
    """The owner each of its containers names (their labels), each one once."""
    folders: dict[str, None] = field(default_factory=dict)
    """The project folders its containers, networks and volumes name (`org.orchestrator.dir`),
    each one once, in the order seen: at most FOLDERS_LOOKED_AT of them, and always the one
    `start_project` would have named."""

    def saw(self, labels: dict[str, str], *, container: bool) -> None:
        """Take in what one more of its objects' labels say: the folder any of them names
        (anyone can add one, listed first or not: see `directory`), and the owner a
        container names."""
        if container:
            named = {k: labels[k] for k in OWNER_LABELS if k in labels}
            self.owners.setdefault(tuple(sorted(named.items())), named)
        folder = labels.get(LABEL_DIR, "")
        if not folder or folder in self.folders:
            return
        if len(self.folders) < FOLDERS_LOOKED_AT or folder == str(projects_dir() / self.name):
            self.folders[folder] = None

    def _labelled(self) -> list[str]:
        return list(self.folders) or [self.labels.get(LABEL_DIR, "")]

    @property
    def alive(self) -> bool:
        """Whether an owner still runs: one any of its containers names, or the one its
        project folder records (see `_looked_at`). Labels are anyone's to set on a shared
        engine, and any object may be listed first: a container naming a dead owner beside
        ours, which name a live one, must not get our project (and its folder) removed; nor
        a network or volume naming a dead owner, or no folder, made while our start has not
        made a container yet."""
        owners = list(self.owners.values()) or [self.labels]
        if any(owner_alive(owner) for owner in owners):
            return True
        for folder in self._looked_at():
            recorded = folder_owner(folder)
            if recorded is not None and owner_alive(recorded):
                return True
        return False

    def _looked_at(self) -> list[Path]:
        """The folders whose owner file and kept mark count: ours alone when its objects name
        it (what another folder says then counts for nothing: anyone can name one); else
        those of other state folders they name, only to be read (see `labelled_folder`)."""
        ours = self.directory
        if ours is not None:
            return [ours]
        found = (labelled_folder(self.name, labelled) for labelled in self._labelled())
        return list(dict.fromkeys(folder for folder in found if folder is not None))

    @property
    def env(self) -> str:
        return self.labels.get(LABEL_ENV, "")

    @property
    def directory(self) -> Path | None:
        """Its project folder when that is ours to change and remove (see `our_folder`):
        the one of those its objects name that is; None otherwise, whatever labels say."""
        for labelled in self._labelled():
            folder = our_folder(self.name, labelled)
            if folder is not None:
                return folder
        return None

    @property
    def kept(self) -> bool:
        """Kept on purpose (see KEPT_FILE), also when its folder is another state folder's
        (that one is only looked at; see `_looked_at`)."""
        return any(kept(folder) for folder in self._looked_at())

    @property
    def owner(self) -> str:
        """Who owns it, as its labels say (as text that starts no line and no escape: any
        container may wear our labels, and this goes into `ps` and errors)."""
        pid = self.labels.get(LABEL_OWNER_PID, DETACHED)
        host = self.labels.get(LABEL_OWNER_HOST)
        return "detached" if pid == DETACHED else printable(f"pid {pid}@{host}")


FOLDERS_LOOKED_AT = 8
"""Of the project folders a project's objects name, how many are looked at (each costs a
look at the filesystem), besides the one `start_project` would have named: anyone on the
engine can add objects naming others."""

LISTED_LABELS = (
    LABEL_PROJECT,
    COMPOSE_SERVICE,
    LABEL_MANAGED,
    LABEL_ENV,
    LABEL_DIGEST,
    LABEL_OWNER_PID,
    LABEL_OWNER_START,
    LABEL_OWNER_HOST,
    LABEL_STARTED,
    LABEL_DIR,
    USER_LABEL,
    FORWARDS_LABEL,
)
OWNER_LABELS = (LABEL_OWNER_PID, LABEL_OWNER_START, LABEL_OWNER_HOST)


def _rows(engine: Engine, kind: Kind, fields: list[str], *, retry: bool = True) -> list[list[Any]]:
    """One listing of our objects of `kind`, each a list of `fields` then LISTED_LABELS (see
    `Engine.rows`): no object is inspected afterwards, so objects removed by someone else
    meanwhile cannot fail the listing."""
    label = f"{LABEL_MANAGED}=1"
    return engine.rows(kind, fields, LISTED_LABELS, label=label, retry=retry)


def list_projects(engine: Engine | None = None, *, retry: bool = True) -> list[ProjectInfo]:
    """Every project carrying our labels and named as ours (`is_project_name`), from its
    containers, networks and volumes. Anyone who can start a container can set these
    labels: what they say is used to find objects of ours, never trusted with a host folder
    (see `ProjectInfo.directory`)."""
    engine = engine or Engine.at()
    found: dict[str, ProjectInfo] = {}
    n = len(LISTED_LABELS)
    for cid, state, ports, *values in _rows(
        engine, "container", ["ID", "State", "Ports"], retry=retry
    ):
        labels = {k: v for k, v in zip(LISTED_LABELS, values[:n], strict=True) if v}
        name = labels.get(LABEL_PROJECT, "")
        if not is_project_name(name):
            continue
        info = found.setdefault(name, ProjectInfo(name, labels, [], []))
        info.saw(labels, container=True)
        service = labels.get(COMPOSE_SERVICE, "")
        info.containers.append((cid, service, state))
        forwards = parse_forwards(labels.get(FORWARDS_LABEL, ""))
        for port in parse_ports(service, ports):
            owner, target = forwards.get((port.container, port.protocol), (service, port.container))
            info.ports.append(dataclasses.replace(port, service=owner, container=target))
        if service == MAIN:
            info.main_user = labels.get(USER_LABEL, "")
    for nid, *values in _rows(engine, "network", ["ID"], retry=retry):
        labels = {k: v for k, v in zip(LISTED_LABELS, values[:n], strict=True) if v}
        name = labels.get(LABEL_PROJECT, "")
        if is_project_name(name):
            info = found.setdefault(name, ProjectInfo(name, labels, [], []))
            info.networks.append(nid)
            info.saw(labels, container=False)
    for vid, *values in _rows(engine, "volume", ["Name"], retry=retry):
        labels = {k: v for k, v in zip(LISTED_LABELS, values[:n], strict=True) if v}
        name = labels.get(LABEL_PROJECT, "")
        if is_project_name(name):  # (one left alone: another's container held it)
            info = found.setdefault(name, ProjectInfo(name, labels, [], []))
            info.volumes.append(vid)
            info.saw(labels, container=False)
    return sorted(found.values(), key=lambda p: (p.labels.get(LABEL_STARTED, ""), p.name))


_PORT = re.compile(
    r"(?P<ip>.*):(?P<host>\d+)(?:-(?P<host_end>\d+))?->"
    r"(?P<port>\d+)(?:-(?P<port_end>\d+))?/(?P<proto>tcp|udp|sctp)"
)


def parse_ports(service: str, text: str) -> list[PublishedPort]:
    """The published ports in a `docker ps` Ports column ("127.0.0.1:32768->80/tcp,
    [::1]:8000-8001->8000-8001/tcp, 9000/tcp"): ranges unfolded, ports not published
    (no "->") left out, in the order `published_ports` gives."""
    out = []
    for part in text.split(","):
        m = _PORT.fullmatch(part.strip())
        if m is None or m["proto"] == "sctp":
            continue
        host, port = int(m["host"]), int(m["port"])
        span = int(m["port_end"] or port) - port
        if int(m["host_end"] or host) - host != span:
            continue  # not a form docker writes
        ip = m["ip"][1:-1] if m["ip"].startswith("[") else m["ip"]
        proto: Any = m["proto"]
        out += [PublishedPort(service, port + i, proto, ip, host + i) for i in range(span + 1)]
    return sorted(out, key=lambda p: f"{p.container}/{p.protocol}")


def claim_from_pool(digest: str, count: int = 1, engine: Engine | None = None) -> list[ProjectInfo]:
    """Take up to `count` waiting members of running pools (`orchestrator pool`) of the
    environment file with this digest: they become the caller's, kept until `down` whatever
    their pool does next. Empty when no pool has one ready."""
    claimed: list[ProjectInfo] = []
    for info in list_projects(engine):
        folder = info.directory
        if len(claimed) == count:
            break
        if info.labels.get(LABEL_DIGEST) != digest or folder is None:
            continue
        if not info.alive:  # its pool is gone; the reaper removes it
            continue
        if move(folder, READY, CLAIMED, (folder / KEPT_FILE).touch):
            claimed.append(info)
    return claimed


def match_project(ref: str, names: list[str]) -> str:
    """The one name `ref` means (see `orchestrator.sandbox.record.match_id`)."""
    return match_id(ref, names, prefix=PROJECT_PREFIX)


def find_project(ref: str, engine: Engine | None = None) -> ProjectInfo:
    """A project by full name, short id or unique prefix (see `match_project`)."""
    projects = {p.name: p for p in list_projects(engine)}
    return projects[match_project(ref, list(projects))]


def remove_project(info: ProjectInfo, engine: Engine | None = None) -> None:
    """Remove a project by the ids already listed for it, then its folder when that is ours
    (`ProjectInfo.directory`: a folder named by a label alone is left alone). Only a
    project named as ours is removed at all."""
    if not is_project_name(info.name):
        raise ProjectNotFound(f"{info.name!r} is not the name of an environment of ours")
    containers = [cid for cid, _, _ in info.containers]
    remove(engine or Engine.at(), info.name, containers, info.networks)
    folder = info.directory
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
