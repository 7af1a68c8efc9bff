"""One guardian per owner process: when the owner dies, by any signal (SIGKILL included), it
removes that owner's projects, containers, networks, volumes and folders, by label, and exits.

It is started on the owner's first spawn (a `python -c` calling `main` below) in a
session of its own, so that signals sent to the owner's process group do not reach it. It
learns of the owner's death from the end of its stdin (the owner holds the only write end)
and, in case a forked child holds that end too, by polling the owner's pid and start time.
Set ORCHESTRATOR_GUARDIAN=0 to go without (the reaper of the next spawn, `ps` or `up` still
removes what a dead owner left).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator import procutil, settings
from orchestrator.backends.container.identity import (
    LABEL_OWNER_HOST,
    LABEL_OWNER_PID,
    LABEL_OWNER_START,
    end_spawns,
    owner_alive,
    owner_labels,
    process_start,
)
from orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.backends.container.projects import ProjectInfo

GUARDIAN_ENV = settings.GUARDIAN.name
LOG_ENV = settings.GUARDIAN_LOG.name
POLL = 0.5
"""Seconds between two checks of the owner's pid (when no end of input told us first)."""

ENTRY = (
    "import sys; from orchestrator.backends.container.guardian import main; "
    "sys.exit(main(sys.argv[1:]))"
)
_lock = threading.Lock()
_guardian: tuple[int, subprocess.Popen[bytes]] | None = None
"""(owner pid, guardian process): a forked child needs a guardian of its own."""


def ensure_guardian() -> None:
    """Start this process's guardian unless it runs (or is switched off)."""
    global _guardian
    if not settings.GUARDIAN.get():
        return
    pid = os.getpid()
    with _lock:
        if _guardian is not None and _guardian[0] == pid and _guardian[1].poll() is None:
            return
        args = [str(pid), process_start(pid), socket.gethostname()]
        log = settings.GUARDIAN_LOG.get() or None
        _guardian = (pid, procutil.guardian(ENTRY, args, log, settings.child_environ()))


def watch(pid: str, start: str, host: str) -> None:
    """Block until the owner is gone, then remove what it owned."""
    labels = owner_labels(pid, start, host)
    ended = threading.Event()

    def read_to_end() -> None:
        with contextlib.suppress(OSError):
            while sys.stdin.buffer.read(4096):
                pass
        ended.set()

    threading.Thread(target=read_to_end, daemon=True).start()
    while owner_alive(labels):
        ended.wait(POLL)
        if ended.is_set():  # the owner closed its end: check now, then keep polling
            ended.clear()
    remove_owned(labels)


def remove_owned(labels: dict[str, str]) -> list[str]:
    """Remove every project (and orphan folder) carrying exactly these owner labels."""
    from orchestrator.backends.container import images
    from orchestrator.backends.container.inventory import (
        list_projects,
        orphan_folders_of,
        remove_project,
    )
    from orchestrator.sandbox.snapshot import reap_suspended

    removed = []
    keys = (LABEL_OWNER_PID, LABEL_OWNER_START, LABEL_OWNER_HOST)
    ended = False
    try:
        owned = [
            info
            for info in list_projects()
            if all(info.labels.get(k) == labels[k] for k in keys) and not info.kept
        ]
        _let_them_stop(owned, list_projects)
        for info in owned:
            with contextlib.suppress(OrchestratorError):
                remove_project(info)
                removed.append(info.name)
        end_spawns(labels)  # (before the engine calls below, which may each take long)
        ended = True
        removed += orphan_folders_of(labels)
        owner = {"pid": labels[LABEL_OWNER_PID], "start": labels[LABEL_OWNER_START]}
        removed += reap_suspended({**owner, "host": labels[LABEL_OWNER_HOST]})  # keep=False
        if owned:  # the images its forks ran, now that no container of theirs uses them
            with contextlib.suppress(OrchestratorError):
                images.reap_orphans()
    finally:  # whatever failed above: no reaper may name this owner again
        if not ended:
            end_spawns(labels)
    return removed


def _let_them_stop(owned: list[ProjectInfo], listing: Callable[[], list[ProjectInfo]]) -> None:
    """Give a dead owner's projects the time to stop themselves before they are removed:
    each sandbox's executor stops it at once, each service's tether in its turn (TURN
    apart). Removing them meanwhile would take endpoints of their networks away beside
    theirs, which a Docker 20.10 engine can deadlock on (removal.leave_networks). Only
    projects of two or more containers on a network wait, each at most as long as its
    services' turns and their stops take; what still runs then is removed all the same."""
    from orchestrator.backends.container.removal import STOP_AFTER_TURNS, TURN

    waiting = {p.name: len(p.containers) for p in owned if p.networks and len(p.containers) > 1}
    if not waiting:
        return
    deadline = time.monotonic() + TURN * max(waiting.values()) + STOP_AFTER_TURNS
    while time.monotonic() < deadline:
        with contextlib.suppress(OrchestratorError):
            running = {
                p.name
                for p in listing()
                if p.name in waiting and any(state == "running" for _, _, state in p.containers)
            }
            if not running:
                return
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP):  # a terminal's Ctrl-C or hang-up is the owner's
        signal.signal(sig, signal.SIG_IGN)
    pid, start, host = argv
    watch(pid, start, host)
    return 0
