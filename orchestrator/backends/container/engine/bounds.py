"""How long an engine call may take, and how that bound is put on a command line: coreutils
`timeout` in front (`bounded`), never cut back off again."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from orchestrator import settings

ENGINE_TIMEOUT_ENV = settings.ENGINE_TIMEOUT.name
UP_TIMEOUT_ENV = settings.UP_TIMEOUT.name
TIMED_OUT = 124
"""Exit status of coreutils `timeout` when the bound was reached."""
KILLED = (128 + 9, -9)
"""How a call ends that coreutils `timeout` had to KILL: 137, or -9 when `timeout` (which
signals its whole process group) went with it."""
GRACE = 5
"""Seconds `timeout` waits after its TERM before it KILLs."""


def engine_timeout() -> float:
    return settings.ENGINE_TIMEOUT.get()


def up_timeout() -> float:
    """Bound of `compose up`, which may build images (ORCHESTRATOR_UP_TIMEOUT, 900 s)."""
    return settings.UP_TIMEOUT.get()


def bounded(argv: Sequence[str], seconds: float) -> list[str]:
    """`argv` under coreutils `timeout` (its own process group, so a hung Compose plugin
    dies with it; status 124), where that program exists; else `argv` as it is (the
    caller's own backstop then holds: see `backstop`)."""
    if shutil.which("timeout") is None:
        return list(argv)
    return ["timeout", "-k", str(GRACE), f"{seconds:g}", *argv]


def backstop(seconds: float) -> float:
    """When a call bounded at `seconds` is given up by its caller, should a process it left
    behind hold its output open: its bound, `timeout`'s grace and five more."""
    return seconds + GRACE + 5


def bound_of(argv: Sequence[str | Path]) -> float | None:
    """The bound a failed call's command line was made with (`bounded`), None for one
    made without; only to judge how it ended (python-on-whales reports its commands so)."""
    args = [str(a) for a in argv]
    if len(args) > 4 and Path(args[0]).name == "timeout" and args[1] == "-k":
        try:
            return float(args[3])
        except ValueError:
            return None
    return None


def is_remote(host: str) -> bool:
    """Whether an engine address may be another machine, whose folders are not ours to
    bind-mount (every address but a local socket)."""
    return bool(host) and not host.startswith(("unix://", "npipe://"))
