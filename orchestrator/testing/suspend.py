"""The suspend profile: `rt.suspend()` saves the environment to disk and removes it;
`orchestrator.wake(name)` starts it again under a new id. `from orchestrator.testing.suspend
import *` in a test module with a `conformance_target` fixture runs these checks:

- the workspace comes back whole, `setup.resume_commands` ran (not `setup.commands`), the
  id is new, the suspended runtime is closed, and the record is consumed;
- files the sandbox wrote outside the workspace come back too (rule "suspend-filesystem":
  a backend whose sandbox has no filesystem of its own saves the workspace only).

A backend that cannot suspend lists the rule "suspend": the profile checks that it says so
with a UsageError before anything changes (the environment runs on), then skips."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import UsageError, list_snapshots, wake
from orchestrator.testing.target import Target

__all__ = [
    "test_suspend_keeps_the_files_outside_the_workspace",
    "test_suspend_then_wake_keeps_the_workspace",
]


def _unsupported(target: Target, folder: Path) -> None:
    """A backend that lists "suspend" refuses it clearly, leaving the environment as it was;
    then the check skips."""
    reason = target.deviation("suspend")
    if not reason:
        return
    with target.spawn(folder) as rt:
        rt.write_file("kept.txt", "kept")
        with pytest.raises(UsageError, match="suspend is not supported"):
            rt.suspend()
        assert rt.read_file("kept.txt") == "kept"
    pytest.skip(f"{target.id} deviates from 'suspend': {reason}")


def test_suspend_then_wake_keeps_the_workspace(conformance_target: Target, tmp_path: Path) -> None:
    _unsupported(conformance_target, tmp_path)
    with conformance_target.spawn(tmp_path) as rt:
        rt.write_file("sub/kept.txt", "kept\n")
        old = rt.info().id
        record = rt.suspend()
        assert rt.closed and record in list_snapshots()
    with conformance_target.environment():
        woken = wake(record.name, backend=conformance_target.backend)
    with woken:
        assert woken.info().id != old
        assert woken.read_file("sub/kept.txt") == "kept\n"
        assert woken.read_file(".setup-count") == "ran\n"  # setup.commands ran once only
        assert woken.read_file(".resume-count") == "resumed\n"
        assert record not in list_snapshots()


def test_suspend_keeps_the_files_outside_the_workspace(
    conformance_target: Target, tmp_path: Path
) -> None:
    _unsupported(conformance_target, tmp_path)
    reason = conformance_target.deviation("suspend-filesystem")
    if reason:
        pytest.skip(f"{conformance_target.id} deviates from 'suspend-filesystem': {reason}")
    with conformance_target.spawn(tmp_path) as rt:
        rt.execute("mkdir -p /opt/kept && echo tool > /opt/kept/out", user="root", check=True)
        record = rt.suspend()
    with conformance_target.environment():
        woken = wake(record.name, backend=conformance_target.backend)
    with woken:
        assert woken.execute("cat /opt/kept/out").stdout == "tool\n"
