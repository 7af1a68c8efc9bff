"""Attacks on the deadlines of file calls on the local backend (issue 19, item 4): a FIFO in
place of the file held a read or a write until the call's deadline; since issue 37 it is
refused at once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import load_environment_text, spawn_runtime
from orchestrator.errors import SandboxPermissionError
from orchestrator.sandbox.base import Runtime
from tests.conftest import bounded

SLACK = 4.0


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    env = load_environment_text(
        "version: 1\nname: l\nbackend: local\n", source="l.yaml", base_dir=tmp_path
    )
    with spawn_runtime(env) as runtime:
        yield runtime


def test_read_file_of_a_fifo_is_refused_at_once(rt: Runtime) -> None:
    """Once held until the deadline; now refused without being opened (issue 37, item 11:
    more in test_attack_issue37_files.py)."""
    os.mkfifo(Path(rt.workdir, "x"))
    outcome, seconds = bounded(lambda: rt.read_file("x", timeout=30), 30 + SLACK)
    assert isinstance(outcome, SandboxPermissionError) and "not a regular file" in str(outcome)
    assert seconds < 30


def test_write_file_to_a_fifo_is_refused_at_once(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.mkfifo(Path(rt.workdir, "y"))
    monkeypatch.setenv("ORCHESTRATOR_FILE_TIMEOUT", "30")
    outcome, seconds = bounded(lambda: rt.write_file("y", "data"), 30 + SLACK)
    assert isinstance(outcome, SandboxPermissionError), outcome
    assert seconds < 30


def test_a_helper_that_cannot_fork_is_sandbox_unavailable() -> None:
    from orchestrator.errors import SandboxUnavailable
    from orchestrator.sandbox.call import raise_held
    from orchestrator.sandbox.results import Outcome

    runc = (  # docker exec under a full pids limit (CI, 2026-11-26): Go aborts, exit 2
        "runtime/cgo: pthread_create failed: Resource temporarily unavailable\n"
        "SIGABRT: abort\nPC=0x7f1d56551eec m=2 sigcode=1\n"
    )
    init = (  # runc, when the process it cloned for the exec died at once (a full pids limit)
        "OCI runtime exec failed: exec failed: unable to start container process: "
        "read init-p: connection reset by peer: unknown\n"
    )
    for said in (
        "sh: can't fork: Resource temporarily unavailable",
        "sh: 1: Cannot fork",
        runc,
        init,
    ):
        with pytest.raises(SandboxUnavailable, match="cannot start a process"):
            raise_held(Outcome(2, False, 0.1), said, "/w/f", "read", 5.0)
    raise_held(Outcome(2, False, 0.1), "tar: ./can't fork: Cannot open", "/w/f", "read", 5.0)
    # (review: what a sandbox printed before the words went into the message as it was)
    hostile = "\x1b]0;pwned\x07\x1b[2J: read init-p: connection reset by peer"
    with pytest.raises(SandboxUnavailable) as caught:
        raise_held(Outcome(126, False, 0.1), hostile, "/w/f", "read", 5.0)
    assert "\x1b" not in str(caught.value) and "\x07" not in str(caught.value)
