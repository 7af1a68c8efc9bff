"""Reaping: removing the projects whose owner process is gone, and the project folders no
project and no live owner accounts for (a start killed half-way), also on the other engines
those folders record; in the background, at most once per REAP_EVERY seconds per process."""

from __future__ import annotations

import atexit
import contextlib
import shutil
import threading
import time
from pathlib import Path

from orchestrator.backends.container import images
from orchestrator.backends.container.engine import (
    Engine,
    engine_timeout,
    resolved_host,
)
from orchestrator.backends.container.identity import (
    end_spawns,
    folder_backend,
    folder_engine,
    folder_owner,
    orphan_folders,
    project_folders,
    reap_folder,
)
from orchestrator.backends.container.projects import ProjectInfo, list_projects, remove_project
from orchestrator.backends.container.removal import listed, project_volumes, remove_by_label
from orchestrator.errors import OrchestratorError


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
    gone: list[dict[str, str]] = []  # the owners of what was removed
    for info in projects:
        spared = info.alive or (info.kept and not include_kept)
        if all_projects or not spared:
            try:
                remove_project(info, engine)
            except OrchestratorError as exc:
                failed.append(exc)
                continue
            removed.append(info.name)
            gone += [*info.owners.values(), info.labels]  # (anyone may have labelled one)
    end_spawns(*gone)  # (of owners that are gone: their engine clients, once)
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
    creator is gone (see `reap`): their names; then end what their creators still ran
    (their marked engine clients: an exec into a removed Swarm task, say). What fails is
    added to `failed`."""
    removed: list[str] = []
    owners: list[dict[str, str]] = []
    try:
        _reap_orphans(live, engine, asked, failed, removed, owners)
    finally:
        end_spawns(*owners)
    return removed


def _reap_orphans(
    live: set[str],
    engine: Engine | None,
    asked: dict[str, Listing | None],
    failed: list[OrchestratorError],
    removed: list[str],
    owners: list[dict[str, str]],
) -> None:
    for folder in orphan_folders(live):
        owner = folder_owner(folder)
        if owner is not None:
            owners.append(owner)
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


def listing_elsewhere(host: str) -> Listing | None:
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
        asked[host] = listing_elsewhere(host)
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
