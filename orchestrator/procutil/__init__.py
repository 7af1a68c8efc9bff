"""The one process core: start a command as its own session, pump its output, keep its
deadline, kill its whole tree. Standard library only, Python 3.7+, and it imports nothing of
ours: the local backend, the plain-exec path and the in-container executor (this package is
copied into every container) all run commands through `run`, so they keep the same rules.

Rules kept here:
- a command that cannot start is an exit status and a message, as a shell gives them
  (127 not found, 126 not executable or unknown user, 2 missing cwd), never an exception;
  only "no process can be started at all" (pids or memory limit) raises `NoProcess`;
- each command starts a new session (its own process group);
- on timeout: SIGTERM to the group and to every descendant found in /proc (also those that
  left the group), then SIGKILL after a short grace (sooner once the main process is gone),
  always, so a process that ignores SIGTERM dies too, before the result is returned;
- a process killed by signal N reports 128+N;
- after the main process exits, output is drained briefly; a background process that keeps
  the pipes open does not hold the call (it keeps running, its pipes are closed on our side).
The host's /proc reads (the local backend's process scans, an owner's start time) use these
same functions rather than psutil: the sandbox side must stay standard-library only, one
implementation is tested on both sides, and psutil would read the same /proc files.

Its parts, each answering one question: `base` (constants, `Outcome`, errors), `fed` (stdin
pipes no fork may keep open), `tree` (which processes are a command's, and ending them),
`users` (who a command runs as), `held` (a child known before it exists, with the signals
that unwind us held while it is made), `start` (starting one as a shell would), `workers` (the
threads a command needs), `pump` (running it), `tty` (running it on a terminal of its own).
This package is copied whole, beside the executor, into every container, where it is
imported as the top-level `procutil`: its parts import one another relatively, never
through `orchestrator`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import (
    CHUNK,
    DRAIN,
    DRAIN_MAX,
    F_SETPIPE_SZ,
    GRACE,
    NO_PROCESS,
    Flag,
    Lost,
    NoProcess,
    Outcome,
    UnknownUser,
    abandon_when,
    abandoned,
    exit_status,
    kept_on,
)
from .held import Held, deferred
from .pump import pump, run
from .tree import (
    SPAWNED_BY,
    alive,
    descendants,
    guard_marked,
    guardian,
    kill_marked,
    kill_tree,
    marked,
    marked_environ,
    process_start,
    remove_tree,
    spawn_mark,
    stat_fields,
)
from .tty import LARGEST, VEOF, Tty, run_tty
from .users import MAX_ID, home_of, in_range, numeric_ids, resolve_ids
from .workers import IDLE_WORKERS, in_thread

if TYPE_CHECKING:  # (types only: not in __all__, so that `import *` finds every name)
    from .base import Chunk as Chunk
    from .base import Killer as Killer
    from .base import Spawn as Spawn
    from .base import StreamKind as StreamKind

__all__ = [
    "CHUNK",
    "DRAIN",
    "DRAIN_MAX",
    "F_SETPIPE_SZ",
    "GRACE",
    "IDLE_WORKERS",
    "LARGEST",
    "MAX_ID",
    "NO_PROCESS",
    "SPAWNED_BY",
    "VEOF",
    "Flag",
    "Held",
    "Lost",
    "NoProcess",
    "Outcome",
    "Tty",
    "UnknownUser",
    "abandon_when",
    "abandoned",
    "alive",
    "deferred",
    "descendants",
    "exit_status",
    "guard_marked",
    "guardian",
    "home_of",
    "in_range",
    "in_thread",
    "kept_on",
    "kill_marked",
    "kill_tree",
    "marked",
    "marked_environ",
    "numeric_ids",
    "process_start",
    "pump",
    "remove_tree",
    "resolve_ids",
    "run",
    "run_tty",
    "spawn_mark",
    "stat_fields",
]
