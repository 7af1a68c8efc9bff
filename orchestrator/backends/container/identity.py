"""Who a project is: its name, labels, owner, folder and subnet."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import socket
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import procutil, settings
from orchestrator.paths import (
    private_folder,
    projects_dir,
    read_owner,
    read_regular,
    state_folder,
    write_file,
    write_owner,
)
from orchestrator.procutil import process_start as process_start

if TYPE_CHECKING:  # (the loader loads pydantic and YAML: `ps` needs neither)
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
LABEL_SNAPSHOT_RECORD = L + "snapshot.record"
"""On a snapshot image: the path of the snapshot record that owns it."""
LABEL_SNAPSHOT_TAG = L + "snapshot.tag"
"""On a snapshot image: its own tag, as its record names it (a record saved over it since
names another: the image is then an orphan)."""
LABEL_SNAPSHOT_STATE = L + "snapshot.state"
"""On a snapshot image: the state folder of the process that made it (whose reapers alone
may remove it)."""
SNAPSHOT_UNCLAIMED = {LABEL_SNAPSHOT_RECORD: "", LABEL_SNAPSHOT_STATE: "", LABEL_SNAPSHOT_TAG: ""}
"""Labels every image built from a file is given: its own LABEL lines cannot make it pass
for a snapshot image of ours (labels are inherited; these, set last, win)."""
DETACHED = "0"
"""Owner pid of a project started by `orchestrator up`: it lives until `down` or `cleanup --all`."""

POOL_ENV = settings.SUBNET_POOL.name
PREFIX_ENV = settings.SUBNET_PREFIX.name


def owner_alive(labels: dict[str, str]) -> bool:
    """Whether the process that owns a project still runs (detached projects count as alive)."""
    pid = labels.get(LABEL_OWNER_PID, DETACHED)
    if pid == DETACHED or labels.get(LABEL_OWNER_HOST) != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):  # (a label anyone may set)
        return True
    start = labels.get(LABEL_OWNER_START, "")
    return not start or process_start(int(pid)) in ("", start)


def end_spawns(*owners: dict[str, str]) -> None:
    """SIGKILL what dead owners started for their sandboxes and still runs (their marked
    engine clients: procutil.SPAWNED_BY), once their projects are removed: an exec into a
    gVisor container that was removed never returns. Only for owners of this machine that
    are gone (`owners`: their labels); only processes whose environment we may read carry a
    mark we see."""
    marks = set()
    for labels in owners:
        start = labels.get(LABEL_OWNER_START, "")
        try:
            pid = int(labels.get(LABEL_OWNER_PID, ""))
        except ValueError:
            continue
        if pid > 1 and start.isdigit() and not owner_alive(labels):
            marks.add(procutil.spawn_mark(pid, start))
    if marks:
        procutil.kill_marked(*sorted(marks), within=1.0, first=True)


OWNER_FILE = "owner"
"""In each project folder: "pid start host" of the process that created it."""
KEPT_FILE = "kept"
"""In a project folder: cleanup stopped the project and kept it (keep_after_cleanup), so
neither a reaper nor the owner's guardian removes it; `cleanup --all` or `down` does."""
BACKEND_FILE = "backend"
"""In the folder of a project of a backend other than Compose: that backend's registered
name, so a reaper asks it to remove what the folder stands for."""
_BACKEND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
ENGINE_FILE = "engine"
"""In the folder of a project on another machine's engine: that engine's address, so a
reaper or a guardian working with another engine still removes it there."""
ORPHAN_AGE = 600.0
"""Seconds after which a project folder without an owner file counts as abandoned."""


def claim_folder(directory: Path, *, backend: str | None = None) -> None:
    """Create a project folder and record who made it, before anything else goes in, so a
    start killed half-way leaves a folder the reaper can tell is abandoned. `backend`: the
    registered name of a backend whose folders are not Compose projects (its class's
    `reap_folder` removes what one stands for)."""
    if directory.parent == projects_dir():
        state_folder(directory.parent.name)  # private, ours, in folders only we may change
    private_folder(directory)
    if backend is not None:
        write_file(directory / BACKEND_FILE, backend + "\n")
    write_owner(directory / OWNER_FILE)


def folder_backend(folder: Path) -> str | None:
    """The backend a project folder names (None: a Compose project's, which names none)."""
    raw = read_regular(folder / BACKEND_FILE, 200)  # (a FIFO there must not hang a reap)
    name = (raw or b"").decode(errors="replace").strip()
    return name if _BACKEND_NAME.fullmatch(name) else None


def reap_folder(folder: Path) -> None:
    """Remove what an abandoned project folder of another backend stands for, then the
    folder, through that backend's class (OrchestratorError: not now; the next reap tries
    again). Only a registered backend is asked: the name is looked up, never imported."""
    from orchestrator.sandbox.registry import get_runtime_class

    name = folder_backend(folder)
    if name is not None:
        get_runtime_class(name).reap_folder(folder)


def kept(directory: Path | None) -> bool:
    return directory is not None and (directory / KEPT_FILE).exists()


def owner_labels(pid: str, start: str, host: str) -> dict[str, str]:
    return {LABEL_OWNER_PID: pid, LABEL_OWNER_START: start, LABEL_OWNER_HOST: host}


def folder_owner(folder: Path) -> dict[str, str] | None:
    """The owner labels recorded in a project folder (None without a readable owner file).
    The folder may be one a label names (another state folder's): the file is read only when
    it is a regular file, never through a link or from a FIFO, and at most 512 bytes of it."""
    found = read_owner(folder / OWNER_FILE)
    return None if found is None else owner_labels(*found)


def project_folders() -> list[Path]:
    """The folders in our projects folder (real folders only: never a link out of it)."""
    try:
        return [d for d in projects_dir().iterdir() if d.is_dir() and not d.is_symlink()]
    except OSError:
        return []


PROJECT_PREFIX = "orch-"
"""The start of every project name (see `project_name`)."""
PROJECT_NAME = re.compile(re.escape(PROJECT_PREFIX) + r"[a-z0-9_-]{1,30}-[0-9a-f]{8}")
"""What `project_name` makes: only a project named so can be ours."""


def is_project_name(name: str) -> bool:
    return PROJECT_NAME.fullmatch(name) is not None


def our_folder(name: str, labelled: str | None) -> Path | None:
    """The folder of project `name` when it is ours to write and remove, else None.

    Labels are anyone's to set (whoever can start a container), so they never name a folder
    by themselves: the folder must be the one `start_project` made for that name, directly
    in our projects folder once resolved (no `..`, no link), a real folder of this user
    holding the owner file it gets first; and the label `labelled` (the container's
    `org.orchestrator.dir`) must name that same folder."""
    if not is_project_name(name) or not labelled:
        return None
    label = Path(labelled)
    if not label.is_absolute() or ".." in label.parts or label.name != name:
        return None
    try:
        base = projects_dir().resolve(strict=True)
        folder = base / name
        info = folder.lstat()
        same = label.resolve(strict=True) == folder
        owner = (folder / OWNER_FILE).lstat()
    except (OSError, RuntimeError):  # gone, unreadable, or a loop of links
        return None
    if not stat.S_ISDIR(info.st_mode) or not stat.S_ISREG(owner.st_mode):
        return None
    if info.st_uid != os.geteuid() or not same:
        return None
    return folder


def labelled_folder(name: str, labelled: str | None) -> Path | None:
    """The folder a project's label names, only to look at (is it kept?) when it is not one
    of ours (another state folder's): an absolute path without `..`, named as the project."""
    if not is_project_name(name) or not labelled:
        return None
    label = Path(labelled)
    if not label.is_absolute() or ".." in label.parts or label.name != name:
        return None
    return label


def orphan_folders(live_projects: set[str]) -> list[Path]:
    """Project folders of no live project whose creator is gone."""
    out = []
    for folder in project_folders():
        if folder.name in live_projects:
            continue
        owner = folder_owner(folder)
        if owner is not None:
            if not owner_alive(owner):
                out.append(folder)
            continue
        with contextlib.suppress(OSError):  # no owner file: abandoned once old enough
            if time.time() - folder.stat().st_mtime > ORPHAN_AGE:
                out.append(folder)
    return out


def project_name(env_name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in env_name.lower())[:30]
    return f"{PROJECT_PREFIX}{safe}-{os.urandom(4).hex()}"  # (uuid: 2 ms to load, for `ps`)


def project_labels(env: Environment, name: str, directory: Path, detached: bool) -> dict[str, str]:
    pid = os.getpid()
    return {
        LABEL_MANAGED: "1",
        LABEL_PROJECT: name,
        LABEL_ENV: env.name,
        LABEL_DIGEST: env.digest,
        LABEL_OWNER_PID: DETACHED if detached else str(pid),
        LABEL_OWNER_START: "" if detached else process_start(pid),
        LABEL_OWNER_HOST: socket.gethostname(),
        LABEL_STARTED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        LABEL_DIR: str(directory),
    }


def subnet_pool() -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int]:
    """The pool project subnets come from, and their prefix length (both settable)."""
    pool, prefix = settings.SUBNET_POOL.get(), settings.SUBNET_PREFIX.get()
    if not pool.prefixlen <= prefix <= pool.max_prefixlen - 2:
        want = f"a whole number of prefix bits ({pool.prefixlen} to {pool.max_prefixlen - 2})"
        raise settings.SUBNET_PREFIX.refused(want)
    return pool, prefix


def pick_subnet(rng: random.Random | None = None) -> str:
    """A random small subnet from our pool. Docker's default address pools hold only ~30
    networks; giving each project an explicit subnet from a large pool of our own lifts that
    limit. Collisions with a live network are retried by the caller."""
    pool, prefix = subnet_pool()
    count = 2 ** (prefix - pool.prefixlen)
    index = (rng or random.SystemRandom()).randrange(count)
    size = 2 ** (pool.max_prefixlen - prefix)
    return str(ipaddress.ip_network((int(pool.network_address) + index * size, prefix)))


_ENGINE_ADDRESS = re.compile(r"(unix|tcp|ssh|npipe|fd)://[^\s]{1,2000}")
ENGINE_FILE_LIMIT = 4096


def folder_engine(folder: Path) -> str | None:
    """The engine a project folder records: its address; "" when it has none (a folder from
    before every folder recorded one: the default engine's), None when the file holds no
    address, or the folder or file is not this user's: in a projects folder others can
    write, their record could make a reap run ssh or connect anywhere (a reaper leaves such
    a folder alone)."""
    path = folder / ENGINE_FILE
    try:
        if any(p.lstat().st_uid != os.geteuid() for p in (folder, path) if os.path.lexists(p)):
            return None
    except OSError:
        return None
    raw = read_regular(path, ENGINE_FILE_LIMIT)
    if raw is None:
        return None if os.path.lexists(path) else ""
    text = raw.decode(errors="replace").strip()
    if len(raw) > ENGINE_FILE_LIMIT or not _ENGINE_ADDRESS.fullmatch(text):
        return None
    return text
