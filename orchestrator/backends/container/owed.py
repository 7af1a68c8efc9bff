"""Kills owed to commands whose call raised SandboxPaused.

Whoever paused the environment (this process, or another: `orchestrator pause ID`), a
command whose call gave up on it with SandboxPaused must not run on, unseen (writing files a
grader then reads), once the sandbox is thawed: not even for the moment a kill after the
thaw takes (a command whose sleep ran out while frozen acts at once). So it is killed at
once, while the sandbox is still frozen (plain.Killer.frozen: a container sharing the
sandbox's process namespace signals the command's processes, found by the mark in their
environment and their session; each dies at the thaw before it runs again). Through the
executor the kill frame also waits in its input; by plain `docker exec` nothing else can.

Where the engine cannot start that container (Podman will not, into a paused container's
namespace), the killer (the command's mark and sessions) is written into the environment's
project folder, and whoever resumes the environment (`rt.resume()`, or `orchestrator
resume` in another process) runs it right after the thaw, before resume returns; the
process that owes it also runs it before its next command there. Then, and only then, the
command may run for the moment that takes.

The records are the environment's own (in its project folder, which only its owner may
change), written whole (a new file renamed into place); each is checked before use (a token
of hex, session numbers, a user as commands take it, a service of the file's), and the
container comes from the environment, never from the record."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

from orchestrator.backends.container.engine import Engine
from orchestrator.backends.container.executor.plain import Killer
from orchestrator.errors import OrchestratorError
from orchestrator.paths import read_regular
from orchestrator.spec.models import USER_RE

log = logging.getLogger("orchestrator.docker")
OWED_DIR = "owed-kills"
RECORD_LIMIT = 16 * 1024
_TOKEN = re.compile(r"[0-9a-f]{32}")
_USER = re.compile(USER_RE)

Locate = Callable[[str], tuple[str, Engine]]
"""A service's container, and the engine that runs it."""


class Owed:
    """The kills owed in one environment (see the module), for its runtime in this process:
    `folder()` is its project folder (None: none yet), `locate` finds a service's container."""

    def __init__(self, folder: Callable[[], Path | None], locate: Locate) -> None:
        self._folder, self._locate = folder, locate
        self._kept: list[Killer] = []
        """Killers whose record could not be written: this process runs them itself."""
        self._mine = False
        """Whether this process owes a kill (then its next command settles first)."""

    @property
    def owing(self) -> bool:
        """Whether this process owes a kill (its next command runs it first)."""
        return self._mine

    def owe(self, service: str, killer: Killer) -> None:
        """Kill the command of `killer` at once, while its sandbox is paused; where the
        engine cannot, record that it must be killed once the sandbox is thawed."""
        if killer.frozen():
            return
        self._mine = True
        folder = self._folder()
        try:
            if folder is None:
                raise OSError("no project folder")
            _write(folder / OWED_DIR, service, killer)
        except OSError as exc:  # this process still kills it, before its next command
            log.warning("cannot record the kill owed to a command in %s: %s", folder, exc)
            self._kept.append(killer)

    def settle(self, *, everyone: bool = False) -> None:
        """Run the kills owed: this process's, before its next command (nothing to do, and
        nothing read, when it owes none); with `everyone`, every record of the environment's
        (at a resume, whoever made them). What the engine refused (the sandbox is paused
        still) stays owed for the next try."""
        if not (everyone or self._mine):
            return
        self._kept = [killer for killer in self._kept if not killer.finish()]
        folder = self._folder()
        left = folder is not None and not _settle(folder / OWED_DIR, self._locate)
        self._mine = bool(self._kept) or (left and self._mine)


def _write(where: Path, service: str, killer: Killer) -> None:
    """A record of `killer`, written whole: a new private file renamed into place."""
    record = {
        "service": service,
        "user": killer.user,
        "token": killer.token,
        "sessions": killer.sessions,
    }
    where.mkdir(mode=0o700, exist_ok=True)
    part = where / f".{killer.token}.part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(record, out)
    os.replace(part, where / f"{killer.token}.json")


def _settle(where: Path, locate: Locate) -> bool:
    """Run every kill recorded in `where`; a record goes once its killer ran. Whether none
    is left."""
    left = False
    for record in sorted(where.glob("*.json")):
        killer = _killer(record, locate)
        if killer is not None and not killer.finish():
            left = True
            continue
        with contextlib.suppress(OSError):
            record.unlink()
    return not left


def _killer(record: Path, locate: Locate) -> Killer | None:
    """The killer a record stands for; None for one that is not a record of ours."""
    raw = read_regular(record, RECORD_LIMIT)
    try:
        data = json.loads(raw or b"")
        service, user, token, sessions = (data[k] for k in ("service", "user", "token", "sessions"))
        ok = (
            isinstance(service, str)
            and (user is None or (isinstance(user, str) and _USER.fullmatch(user)))
            and isinstance(token, str)
            and _TOKEN.fullmatch(token)
            and isinstance(sessions, list)
            and all(isinstance(s, str) and s.isdigit() for s in sessions)
        )
        if not ok:
            raise ValueError("not a record of ours")
        container, engine = locate(service)
    except (ValueError, KeyError, TypeError, OrchestratorError) as exc:
        log.warning("%s is no kill owed here (%s): removed", record, exc)
        return None
    return Killer(engine, container, user, token, sessions)
