"""A kept call's connection to an environment's resident (backends/container/resident.py)
when the resident greets late: on a loaded machine it is waited for while its sandbox runs;
a paused sandbox is said at once; one that never greets is said within a bound."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.backends.container import resident
from orchestrator.backends.container.executor import wire
from orchestrator.endpoint import READY_WITHIN, RECORD
from orchestrator.errors import SandboxPaused, SandboxUnavailable

ENDS: list[socket.socket] = []
"""The fake residents' ends of their connections (closed after each test)."""


@pytest.fixture(autouse=True)
def _closed() -> Iterator[None]:
    yield
    while ENDS:
        ENDS.pop().close()


def greeting_after(seconds: float | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dial` made to hand back a connection whose resident greets after `seconds` (None:
    never)."""

    def dial(folder: str) -> socket.socket:
        ours, theirs = socket.socketpair()
        ENDS.append(theirs)
        if seconds is not None:

            def greet() -> None:
                time.sleep(seconds)
                theirs.sendall(wire.pack(wire.READY, 0, json.dumps({}).encode()))

            threading.Thread(target=greet, daemon=True).start()
        return ours

    monkeypatch.setattr(resident, "dial", dial)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / RECORD).write_text("{}")
    return tmp_path


def never_reopened() -> bool:
    raise AssertionError("a resident that is there is never started again")


def test_a_resident_that_greets_late_on_a_running_sandbox_is_waited_for(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI, once, at load 15: four callers met a resident started just then, and one was
    told the environment's endpoint does not answer after one second."""
    greeting_after(READY_WITHIN + 0.5, monkeypatch)
    asked: list[int] = []

    def probe() -> None:
        asked.append(1)

    link = resident._connected(project, probe, never_reopened)
    try:
        assert link.alive and asked == [1]
    finally:
        link.close()


def test_a_paused_sandbox_is_said_at_once(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    greeting_after(None, monkeypatch)
    started = time.monotonic()
    with pytest.raises(SandboxPaused):
        resident._connected(project, lambda: SandboxPaused("paused"), never_reopened)
    assert time.monotonic() - started < READY_WITHIN + 2


def test_a_resident_that_never_greets_is_said_within_the_bound(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resident, "SLOW_READY", 0.5)
    greeting_after(None, monkeypatch)
    started = time.monotonic()
    with pytest.raises(SandboxUnavailable, match="does not answer"):
        resident._connected(project, lambda: None, never_reopened)
    assert time.monotonic() - started < READY_WITHIN + 0.5 + 2


def test_a_sandbox_paused_during_the_wait_is_said_within_a_second_or_two(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe is asked again each second of the wait (a review: asked once, a pause
    by another process just after it held the call the whole 15 s)."""
    greeting_after(None, monkeypatch)
    looks: list[int] = []

    def probe() -> SandboxPaused | None:
        looks.append(1)
        return SandboxPaused("paused") if len(looks) > 1 else None

    started = time.monotonic()
    with pytest.raises(SandboxPaused):
        resident._connected(project, probe, never_reopened)
    assert time.monotonic() - started < READY_WITHIN + 4


def test_a_probe_that_raises_leaves_no_connection_open(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that does not answer the probe (its DockerError) closed nothing: the
    connection and its two threads stayed (a review: 5 calls, 10 threads)."""
    import threading as th

    from orchestrator.errors import DockerError

    greeting_after(None, monkeypatch)
    before = th.active_count()

    def probe() -> None:
        raise DockerError("inspecting the sandbox timed out")

    for _ in range(3):
        with pytest.raises(DockerError):
            resident._connected(project, probe, never_reopened)
    deadline = time.monotonic() + 5
    while th.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert th.active_count() <= before
