"""`Tethers.release` (a project's `release`) never kills a tether (that would stop its
service) and never drops one still running: a slow one (a gVisor service's exec ends
slowly) is waited for by a thread, so it is reaped, not left a zombie with a
ResourceWarning at the next collection (CI, 2026-11-26,
test_per_service_isolation_main_runc_service_gvisor)."""

from __future__ import annotations

import gc
import os
import subprocess
import time
import warnings

import pytest

from orchestrator.backends.container import removal
from orchestrator.backends.docker import tether


def test_a_slow_tether_is_waited_for_not_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tether, "TETHER_WAIT", 0.1)
    project = tether.Tethers()
    # (sleeping well past what a loaded machine takes between the release and the look)
    slow = subprocess.Popen(["sh", "-c", "cat >/dev/null; sleep 5"], stdin=subprocess.PIPE)
    pid = slow.pid
    project._procs.append(slow)
    del slow
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        project.release()  # writes the word, closes its input; it is still sleeping
        gc.collect()
        assert os.path.exists(f"/proc/{pid}")  # not killed
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        gc.collect()
    assert not os.path.exists(f"/proc/{pid}")  # ended and reaped: no zombie left


class _Target:
    """An exec target whose tether is a local `cat` (the script is never run here: it
    signals PID 1)."""

    def __init__(self, seen: list[list[str]]) -> None:
        self.seen = seen

    def argv(self, command: list[str], *, stdin: bool) -> list[str]:
        self.seen.append(command)
        return ["sh", "-c", "cat >/dev/null"]


def test_the_services_of_a_dead_owner_stop_in_turns() -> None:
    """Each tether waits its turn before it stops its service: endpoints of one network going
    at the same moment can deadlock the engine (removal.leave_networks)."""
    seen: list[list[str]] = []
    project = tether.Tethers()
    project.tie([_Target(seen) for _ in range(3)])  # type: ignore[misc]
    project.release()
    assert [c[:3] for c in seen] == [["/bin/sh", "-c", tether.TETHER]] * 3
    delays = [float(c[4]) for c in seen]
    assert delays == [removal.TURN, 2 * removal.TURN, 3 * removal.TURN]
    assert 'sleep "$1"' in tether.TETHER.split("kill -TERM 1")[0]
