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
