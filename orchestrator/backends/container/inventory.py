"""Find our projects by label, and remove them by id (never by a broad filter): what
ContainerRuntime answers for `orchestrator.environments`, `remove_environment` and `reap`.
The listing is projects.py's, the reaping reaping.py's."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from orchestrator.backends.container import images
from orchestrator.backends.container.engine import (
    Engine,
    resolved_host,
)
from orchestrator.backends.container.identity import (
    LABEL_STARTED,
    end_spawns,
    folder_backend,
    folder_engine,
    project_folders,
)
from orchestrator.backends.container.layout import GATEWAY
from orchestrator.backends.container.membership import membership
from orchestrator.backends.container.projects import (
    FOLDERS_LOOKED_AT,
    ProjectInfo,
    claim_from_pool,
    find_project,
    list_projects,
    match_project,
    parse_ports,
    remove_project,
)
from orchestrator.backends.container.reaping import (
    PROBE_TIMEOUT,
    Listing,
    listing_elsewhere,
    orphan_folders_of,
    reap,
    reap_soon,
    wait_for_reaper,
)
from orchestrator.backends.container.removal import (
    remove_by_label as remove_by_label,  # (where a start that failed half-way asks for it)
)
from orchestrator.backends.container.usage import keep_counts_of, usage_of
from orchestrator.errors import OrchestratorError, PartialListing, ProjectNotFound, UsageError
from orchestrator.sandbox.keeping import RunningLogs
from orchestrator.sandbox.record import recall_data
from orchestrator.sandbox.results import EnvironmentStatus
from orchestrator.sandbox.usage import Usage
from orchestrator.spec.published import MAIN

log = logging.getLogger("orchestrator.docker")

__all__ = [
    "FOLDERS_LOOKED_AT",
    "PROBE_TIMEOUT",
    "ProjectInfo",
    "claim_from_pool",
    "elsewhere",
    "find_project",
    "list_projects",
    "logs_of",
    "match_project",
    "orphan_folders_of",
    "parse_ports",
    "project_statuses",
    "reap",
    "reap_all",
    "reap_soon",
    "remove_by_id",
    "remove_by_label",
    "remove_project",
    "running_environments",
    "running_ids",
    "wait_for_reaper",
]


ProjectStatus = EnvironmentStatus


def project_statuses(
    engine: Engine | None = None, *, usage: bool = False, unlisted: list[str] | None = None
) -> tuple[list[ProjectStatus], list[str]]:
    """Our environments, after reaping those whose owner is gone (returned second, by name),
    with their ports as the one listing call read them: nothing is inspected afterwards, so
    containers removed meanwhile by anyone cannot fail it. The reap is a side task: a
    project it cannot remove now (another process removing it at the same time, slowly; an
    engine error) is logged and listed as it is, never a failed listing. `unlisted` gets a
    line for each other engine that did not answer about the projects it holds."""
    engine = engine or Engine.at()
    projects = list_projects(engine)
    asked: dict[str, Listing | None] = {}  # other engines the reap asked, and what they hold
    failures: list[OrchestratorError] = []  # what stays, and is listed, until the next reap
    removed = reap(engine=engine, projects=projects, asked=asked, failures=failures)
    for exc in failures:
        log.warning("left for the next reap: %s", exc)
    live = [p for p in projects if p.name not in removed]
    live += _alive_elsewhere(asked, removed, unlisted)
    away = elsewhere() if usage else {}
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
            started=p.labels.get(LABEL_STARTED, ""),
            usage=read[0] if read else None,
            command=read[1] if read else "",
        )
        for p, read in zip(
            live, _usages(live, engine, away) if usage else [None] * len(live), strict=True
        )
    ]
    if usage:
        keep_counts_of({c for p in live for c, service, _ in p.containers if service == GATEWAY})
    return statuses, removed


def _usages(
    live: list[ProjectInfo], engine: Engine, away: dict[str, str]
) -> list[tuple[Usage, str] | None]:
    """Each project's usage (see `_usage`), read side by side: one slow gateway log (at most
    egress_log.READ_WITHIN) holds up no other."""
    if not live:
        return []
    from concurrent.futures import ThreadPoolExecutor  # (only with --usage)

    with ThreadPoolExecutor(max_workers=min(8, len(live))) as pool:
        return list(
            pool.map(
                lambda p: _usage(p, Engine.at(away[p.name]) if p.name in away else engine), live
            )
        )


def _usage(project: ProjectInfo, engine: Engine) -> tuple[Usage, str] | None:
    """A project's usage and what its main sandbox runs now, on the engine that listed it;
    None when that engine fails."""
    try:
        return usage_of(engine, project.containers)
    except OrchestratorError as exc:
        log.warning("reading %s's usage failed: %s", project.name, exc)
        return None


def _alive_elsewhere(
    asked: dict[str, Listing | None], removed: list[str], unlisted: list[str] | None = None
) -> list[ProjectInfo]:
    """Our projects that another engine holds (one that `--engine podman` or `-H` started):
    each whose folder names that engine, and which the reap spared, from one listing of each
    such engine (the reap's, where it made one). An engine that did not answer within
    PROBE_TIMEOUT adds none, and a line naming it and its projects to `unlisted`."""
    away = elsewhere()
    found = []
    for host in sorted(set(away.values())):
        if host not in asked:
            asked[host] = listing_elsewhere(host)
        listing = asked[host]
        if listing is None and unlisted is not None:
            names = sorted(n for n, h in away.items() if h == host and n not in removed)
            if names:
                unlisted.append(f"the engine at {host} did not answer: {', '.join(names)}")
        for name, info in (listing[1] if listing else {}).items():
            if away.get(name) == host and name not in removed:
                found.append(info)
    return sorted(found, key=lambda p: (p.labels.get(LABEL_STARTED, ""), p.name))


def running_environments(*, usage: bool = False) -> tuple[list[EnvironmentStatus], list[str]]:
    """The container backends' environments, after reaping those whose owner is gone (with
    `usage`, each one's usage)."""
    unlisted: list[str] = []
    listed = project_statuses(usage=usage, unlisted=unlisted)
    if unlisted:
        raise PartialListing("; ".join(unlisted), listed)
    return listed


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
    end_spawns(*info.owners.values(), info.labels)  # (of an owner that is gone: its clients)
    with contextlib.suppress(OrchestratorError):  # a woken environment's images: now orphans
        images.reap_orphans(engine)
    return info.name


def logs_of(
    ident: str, service: str | None, *, tail: int | None, follow: bool
) -> RunningLogs | None:
    """The logs of our Docker environment `ident` on the process's engine, read through the
    engine's API (Keeping.running_logs), when its record and its containers are found whole:
    the container of each of the services asked (the main sandbox and the file's services,
    as the record names them), by its name; None otherwise (attaching says what is wrong)."""
    engine = Engine.at()
    if engine.socket is None:  # (the API on this machine's socket only)
        return None
    info = next((p for p in list_projects(engine) if p.name == ident), None)
    folder = info.directory if info is not None else None
    if info is None or folder is None:
        return None
    try:
        record = recall_data(folder)
    except ProjectNotFound:
        return None
    spec, host = record.get("spec"), record.get("host")
    extra = spec.get("services") if isinstance(spec, dict) else None
    here = isinstance(host, str) and resolved_host(host) == resolved_host(engine.address)
    if record.get("backend") != "docker" or not isinstance(extra, dict) or not here:
        return None
    known = [MAIN, *sorted(str(name) for name in extra)]
    services = [service] if service else known
    if service not in (None, *known):
        return None
    for name in services:  # each by its name, as attaching finds it (never by a label)
        try:
            engine.inspected(f"{ident}-{name}-1", "inspecting a service")
        except OrchestratorError:  # gone, or the engine cannot say: attaching says it
            return None

    def log_of(name: str) -> Iterator[bytes]:
        return engine.logs(f"{ident}-{name}-1", tail=tail, follow=follow)

    return services, log_of


def reap_all(*, everything: bool = False, include_kept: bool = False) -> list[str]:
    """Reap environments whose owner is gone (all of ours with `everything`) and snapshot
    images whose record is gone: what was removed, one line each."""
    gone = [f"{image} (its snapshot is gone)" for image in images.reap_orphans()]
    return gone + reap(all_projects=everything, include_kept=include_kept)
