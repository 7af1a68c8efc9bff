"""Find our projects by label, and remove them by id (never by a broad filter)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.backends.container import images
from orchestrator.backends.container.engine import (
    COMPOSE_SERVICE,
    Engine,
    Kind,
    engine_timeout,
    resolved_host,
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
    folder_backend,
    folder_engine,
    folder_owner,
    is_project_name,
    kept,
    labelled_folder,
    orphan_folders,
    our_folder,
    owner_alive,
    project_folders,
    reap_folder,
)
from orchestrator.backends.container.layout import FORWARDS_LABEL, USER_LABEL, parse_forwards
from orchestrator.backends.container.membership import CLAIMED, READY, membership, move
from orchestrator.backends.container.removal import listed, project_volumes, remove
from orchestrator.backends.container.removal import (
    remove_by_label as remove_by_label,  # (where a start that failed half-way asks for it)
)
from orchestrator.errors import OrchestratorError, ProjectNotFound, UsageError
from orchestrator.paths import projects_dir
from orchestrator.sandbox.record import match_id
from orchestrator.sandbox.results import EnvironmentStatus
from orchestrator.spec.models import PublishedPort
from orchestrator.spec.resolve import MAIN

log = logging.getLogger("orchestrator.docker")


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
        pid = self.labels.get(LABEL_OWNER_PID, DETACHED)
        return "detached" if pid == DETACHED else f"pid {pid}@{self.labels.get(LABEL_OWNER_HOST)}"


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


ProjectStatus = EnvironmentStatus


def project_statuses(engine: Engine | None = None) -> tuple[list[ProjectStatus], list[str]]:
    """Our environments, after reaping those whose owner is gone (returned second, by name),
    with their ports as the one listing call read them: nothing is inspected afterwards, so
    containers removed meanwhile by anyone cannot fail it. The reap is a side task: a
    project it cannot remove now (another process removing it at the same time, slowly; an
    engine error) is logged and listed as it is, never a failed listing."""
    engine = engine or Engine.at()
    projects = list_projects(engine)
    asked: dict[str, Listing | None] = {}  # other engines the reap asked, and what they hold
    failures: list[OrchestratorError] = []  # what stays, and is listed, until the next reap
    removed = reap(engine=engine, projects=projects, asked=asked, failures=failures)
    for exc in failures:
        log.warning("left for the next reap: %s", exc)
    live = [p for p in projects if p.name not in removed] + _alive_elsewhere(asked, removed)
    statuses = [
        ProjectStatus(
            id=p.name,
            env=p.env,
            owner=p.owner,
            state=",".join(sorted({state for _, _, state in p.containers})) or "no containers",
            containers=len(p.containers),
            networks=len(p.networks),
            ports=tuple(p.ports),
            pool=" ".join(membership(p.directory) or ()),
            paused=any(state == "paused" for _, _, state in p.containers),
        )
        for p in live
    ]
    return statuses, removed


def _alive_elsewhere(asked: dict[str, Listing | None], removed: list[str]) -> list[ProjectInfo]:
    """Our projects that another engine holds (one that `--engine podman` or `-H` started):
    each whose folder names that engine, and which the reap spared, from one listing of each
    such engine (the reap's, where it made one). An engine that did not answer within
    PROBE_TIMEOUT adds none."""
    away = elsewhere()
    found = []
    for host in sorted(set(away.values())):
        if host not in asked:
            asked[host] = _listing_elsewhere(host)
        listing = asked[host]
        for name, info in (listing[1] if listing else {}).items():
            if away.get(name) == host and name not in removed:
                found.append(info)
    return sorted(found, key=lambda p: (p.labels.get(LABEL_STARTED, ""), p.name))


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


def reap(
    all_projects: bool = False,
    engine: Engine | None = None,
    projects: list[ProjectInfo] | None = None,
    *,
    include_kept: bool = False,
    asked: dict[str, Listing | None] | None = None,
    failures: list[OrchestratorError] | None = None,
) -> list[str]:
    """Remove our projects whose owner process is gone (or all of ours), and project folders
    that no project and no live owner account for (a start killed half-way). Projects kept
    on purpose go only with `include_kept` (or `all_projects`). Never touches anything
    without our labels, nor folders outside our state folder. `projects`: a listing the
    caller already made; `asked`: filled with the listings of the other engines asked about
    folders that record them (see `_removed_elsewhere`).

    What cannot be removed now (another process's removal that does not end, an engine
    error) stops nothing else: the reap goes on, and that project stays, for the next reap.
    Its failures are added to `failures` when given (a listing reaps on the side, and must
    not fail over someone else's project), else the first is raised once the rest is done."""
    removed: list[str] = []
    failed: list[OrchestratorError] = []
    projects = list_projects(engine) if projects is None else projects
    for info in projects:
        spared = info.alive or (info.kept and not include_kept)
        if all_projects or not spared:
            try:
                remove_project(info, engine)
            except OrchestratorError as exc:
                failed.append(exc)
                continue
            removed.append(info.name)
    try:
        images.reap_orphans(engine)  # snapshot images whose snapshot was removed by hand
    except OrchestratorError as exc:
        failed.append(exc)
    live = {p.name for p in projects if p.name not in removed}
    removed += _reap_folders(live, engine, {} if asked is None else asked, failed)
    if failures is not None:
        failures += failed
    elif failed:
        raise failed[0]
    return removed


def _reap_folders(
    live: set[str],
    engine: Engine | None,
    asked: dict[str, Listing | None],
    failed: list[OrchestratorError],
) -> list[str]:
    """Remove the project folders of ours that no project in `live` accounts for and whose
    creator is gone (see `reap`): their names. What fails is added to `failed`."""
    removed = []
    for folder in orphan_folders(live):
        if folder_backend(folder) is not None:  # another backend's (a stack on a Swarm)
            with contextlib.suppress(OrchestratorError):  # its engine is away: next reap
                reap_folder(folder)
                removed.append(folder.name)
            continue
        if (gone := _removed_elsewhere(folder, engine, asked)) is not None:
            removed += [folder.name] if gone else []
            continue
        try:
            if _has_objects(folder.name, engine):  # created since we listed: not an orphan
                continue
        except OrchestratorError as exc:
            failed.append(exc)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder.name)
    return removed


def orphan_folders_of(owner: dict[str, str]) -> list[str]:
    """Remove the project folders this owner created that hold no project (a start it did
    not finish); return their names."""
    removed: list[str] = []
    asked: dict[str, Listing | None] = {}
    for folder in project_folders():
        if folder_owner(folder) != owner:
            continue
        if folder_backend(folder) is not None:  # another backend's (a stack on a Swarm)
            with contextlib.suppress(OrchestratorError):  # its engine is away: next reap
                reap_folder(folder)
                removed.append(folder.name)
        elif (gone := _removed_elsewhere(folder, None, asked)) is not None:
            removed += [folder.name] if gone else []
        elif not _has_objects(folder.name, None):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed


PROBE_TIMEOUT = 5.0
"""Seconds a reap waits on each of another engine's two listing calls (the engine
timeout, if shorter; no second try)."""
PROBE_AGAIN = 60.0
"""Seconds before a reap asks again an engine that did not answer."""
_silent: dict[str, float] = {}
_silent_lock = threading.Lock()
Listing = tuple[Engine, dict[str, "ProjectInfo"]]


def _listing_elsewhere(host: str) -> Listing | None:
    """The engine at address `host` and our projects there, each call bounded
    by PROBE_TIMEOUT; None when it did not answer (and, for
    PROBE_AGAIN seconds after, without asking)."""
    with _silent_lock:
        if time.monotonic() - _silent.get(host, -PROBE_AGAIN) < PROBE_AGAIN:
            return None
    there = Engine.at(host, timeout=min(engine_timeout(), PROBE_TIMEOUT))
    try:
        return there, {p.name: p for p in list_projects(there, retry=False)}
    except OrchestratorError:
        _gone_silent(host)
        return None


def _gone_silent(host: str) -> None:
    with _silent_lock:
        _silent[host] = time.monotonic()


def _removed_elsewhere(
    folder: Path, engine: Engine | None = None, asked: dict[str, Listing | None] | None = None
) -> bool | None:
    """For the folder of a project on another engine than `engine` (Podman's, another
    machine's, or Docker's when the caller works with another): what its own engine says
    decides. A project alive there (its owner runs, or it is detached or kept) is spared;
    one whose owner is gone is removed there (by label, by id), then its folder. None for
    a project of `engine`; else whether it was removed (False also while that
    engine does not answer, and for a folder whose record names no engine: left alone).
    `asked`: the listings of one reap, by engine (each engine is listed once)."""
    host = folder_engine(folder)
    here = resolved_host((engine or Engine.at()).address)
    if host == "":  # made before folders recorded their engine: the default engine's
        return None if here == resolved_host("", default=True) else False
    if host is None:
        return False
    if host == here:
        return None
    asked = {} if asked is None else asked
    if host not in asked:
        asked[host] = _listing_elsewhere(host)
    listing = asked[host]
    if listing is None:
        return False
    there, projects = listing
    info = projects.get(folder.name)
    if info is not None and (info.alive or info.kept):
        return False
    try:
        remove_by_label(folder.name, there)
    except OrchestratorError:  # that engine is away: the next reap, and no more asking now
        asked[host] = None
        _gone_silent(host)
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def _has_objects(name: str, engine: Engine | None) -> bool:
    engine = engine or Engine.at()
    containers, networks = listed(engine, name)
    return bool(containers or networks or project_volumes(engine, name))


_last_reap = 0.0
_reap_lock = threading.Lock()
_reaper: threading.Thread | None = None
REAP_EVERY = 30.0
"""Seconds between two background reaps of one process (each lists our objects once)."""


def reap_soon() -> None:
    """Reap dead owners' projects in a background thread, at most once per REAP_EVERY
    seconds per process: every spawn calls it, so leftovers of crashed runs do not pile up,
    and it costs the spawn nothing."""
    global _last_reap, _reaper
    with _reap_lock:
        now = time.monotonic()
        if _last_reap and now - _last_reap < REAP_EVERY:
            return
        _last_reap = now

    def reap_quietly() -> None:
        with contextlib.suppress(OrchestratorError):
            reap()

    _reaper = threading.Thread(target=reap_quietly, name="orchestrator-reaper", daemon=True)
    _reaper.start()


def wait_for_reaper(timeout: float = 10.0) -> None:
    """Let a background reap finish (a short-lived process such as `orchestrator up`)."""
    if _reaper is not None:
        _reaper.join(timeout)


atexit.register(wait_for_reaper)  # a short-lived process (`orchestrator up`) lets it end


# ----- what ContainerRuntime answers for `orchestrator.environments`, `remove_environment`, `reap`


def running_environments() -> tuple[list[EnvironmentStatus], list[str]]:
    """The container backends' environments, after reaping those whose owner is gone."""
    return project_statuses()


def elsewhere() -> dict[str, str]:
    """Our project folders on another engine than the process's (one named for a spawn, as
    `--engine podman` or `-H` for an `up`): id -> that engine's address. Their ids are
    ours to take down by id, whichever engine the caller names."""
    here = resolved_host(Engine.at().address)
    found = {}
    for folder in project_folders():
        host = folder_engine(folder)
        if host and host != here and folder_backend(folder) is None:
            found[folder.name] = host
    return found


def running_ids() -> list[str]:
    """Ids of our projects on the process's engine, and of those whose folder records
    another engine (see `elsewhere`; not asked there: a listing must not wait on it)."""
    return sorted({p.name for p in list_projects()} | set(elsewhere()))


def remove_by_id(ident: str, *, force: bool = False) -> str | None:
    """Remove our environment `ident` (an exact id; None: none of ours), on the engine its
    folder records (else the process's). One its owner process still uses needs `force`,
    unless it was kept on purpose (claimed from a pool, `up`)."""
    away = elsewhere()
    engine = Engine.at(away.get(ident, ""))
    info = next((p for p in list_projects(engine) if p.name == ident), None)
    if info is None:
        return None
    if info.owner != "detached" and info.alive and not info.kept and not force:
        raise UsageError(
            f"{info.name} belongs to a running process ({info.owner}), which still uses it; "
            "pass force=True (--force) to take it down anyway"
        )
    remove_project(info, engine)
    with contextlib.suppress(OrchestratorError):  # a woken environment's images: now orphans
        images.reap_orphans(engine)
    return info.name


def reap_all(*, everything: bool = False, include_kept: bool = False) -> list[str]:
    """Reap environments whose owner is gone (all of ours with `everything`) and snapshot
    images whose record is gone: what was removed, one line each."""
    gone = [f"{image} (its snapshot is gone)" for image in images.reap_orphans()]
    return gone + reap(all_projects=everything, include_kept=include_kept)
