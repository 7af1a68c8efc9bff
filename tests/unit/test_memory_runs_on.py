"""After a memory save given up at its deadline (backends/docker/memory.py `_runs_on`): a
sandbox that saves (something writes its image) stops once saved, however long that takes,
and is waited for; one that nothing writes for SETTLE seconds runs on. (Found by CI on a
loaded machine: a sandbox saving 200 MB wrote nothing for over a second, was taken as
running on, and then stopped with nobody to start it again.)"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.docker import memory
from orchestrator.errors import DockerError


class Engine:
    """Says the sandbox runs until `stops` (a monotonic time), then that it exited; until
    `blind`, it answers nothing (an engine too loaded to)."""

    def __init__(self, stops: float = float("inf"), blind: float = 0.0) -> None:
        self.stops, self.blind = stops, blind

    def inspected(self, container: str, action: str) -> dict[str, Any]:
        if time.monotonic() < self.blind:
            raise DockerError("the engine did not answer in time")
        return {"State": {"Running": time.monotonic() < self.stops}}


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "SETTLE", 0.3)
    monkeypatch.setattr(memory, "AFTER", 1.0)
    monkeypatch.setattr(memory, "up_timeout", lambda: 10.0)


def runs_on(engine: Engine, folder: Path, pid: int | None = None) -> tuple[bool, float]:
    began = time.monotonic()
    said = memory._runs_on(engine, "main", folder, pid)  # type: ignore[arg-type]
    return said, time.monotonic() - began


def soon(seconds: float) -> float:
    return time.monotonic() + seconds


def test_a_sandbox_that_never_began_runs_on_after_the_settle(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.img").touch()  # (runsc makes it; the sandbox never took it)
    said, took = runs_on(Engine(), tmp_path)
    assert said is True
    assert memory.SETTLE <= took < memory.SETTLE + 2


def test_a_sandbox_writing_and_quiet_a_long_while_is_waited_for_until_it_stops(
    tmp_path: Path,
) -> None:
    with (tmp_path / "checkpoint.img").open("wb") as image:  # (the sandbox's)
        image.write(b"state")  # (then nothing for longer than the settle)
        said, took = runs_on(Engine(stops=soon(1.5)), tmp_path)
    assert said is False
    assert took >= 1.4


def test_a_request_sent_and_not_yet_taken_is_a_save(tmp_path: Path) -> None:
    """runsc killed just after it sent the sandbox its image to write: the file is open
    only inside the message, which a busy sandbox has not read yet."""
    here, there = socket.socketpair(socket.AF_UNIX)
    with here, there:
        fd = os.open(tmp_path / "checkpoint.img", os.O_WRONLY | os.O_CREAT, 0o600)
        socket.send_fds(here, [b"save"], [fd])
        os.close(fd)  # (runsc's end, gone)
        assert memory._written(tmp_path, None) is True
        said, _ = runs_on(Engine(stops=soon(1.0)), tmp_path)
        assert said is False
        _, [taken], _, _ = socket.recv_fds(there, 16, 1)
        os.close(taken)
    assert memory._written(tmp_path, None) is False


def test_a_save_that_failed_and_let_go_of_its_image_is_not_waited_for(
    tmp_path: Path,
) -> None:
    """runsc failed by itself after the sandbox wrote part of its image, and the sandbox
    runs on: what was written says nothing; only a writer still there does."""
    (tmp_path / "checkpoint.img").write_bytes(b"part of a state")
    said, took = runs_on(Engine(), tmp_path)
    assert said is True
    assert took < memory.SETTLE + 2


def test_a_sandbox_that_stops_a_while_after_its_writing_ended_is_seen_stopped(
    tmp_path: Path,
) -> None:
    """Saved, its image closed; the engine says it stopped only later (as a loaded one
    does): it was seen writing, so it is waited for."""
    image = (tmp_path / "checkpoint.img").open("wb")
    image.write(b"state")
    closer = threading.Timer(0.5, image.close)
    closer.start()
    try:
        said, took = runs_on(Engine(stops=soon(0.5 + memory.AFTER * 0.4)), tmp_path)
    finally:
        closer.join()
    assert said is False
    assert took >= 0.5 + memory.AFTER * 0.3


def test_an_engine_that_cannot_answer_a_while_never_makes_it_restart_a_running_one(
    tmp_path: Path,
) -> None:
    image = (tmp_path / "checkpoint.img").open("wb")
    closer = threading.Timer(1.5, image.close)
    closer.start()
    try:
        said, took = runs_on(Engine(blind=soon(1.0)), tmp_path)
    finally:
        closer.join()
    assert said is True  # (it runs, as the engine said once it could)
    assert took >= 1.5


def test_one_still_running_at_the_bound_is_taken_as_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "up_timeout", lambda: 0.5)
    monkeypatch.setattr(memory, "AFTER", 60.0)
    with (tmp_path / "checkpoint.img").open("wb"):
        said, took = runs_on(Engine(), tmp_path)
    assert said is True
    assert took < 2


def test_without_leases_the_sandbox_s_own_open_file_tells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "_lease_refused", lambda path: None)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    other = tmp_path / "realer"  # (a name that merely begins the same)
    other.mkdir()
    (real / "checkpoint.img").touch()
    with (other / "x").open("wb"):
        assert memory._written(real, os.getpid()) is False
    with (real / "checkpoint.img").open("rb"):
        assert memory._written(real, os.getpid()) is True
        assert memory._written(tmp_path / "link", os.getpid()) is True  # (through a link)
        assert memory._written(real, None) is False


def test_only_a_real_pid_is_taken() -> None:
    assert memory._pid_of({"State": {"Pid": 0}}) is None
    assert memory._pid_of({"State": {"Pid": True}}) is None
    assert memory._pid_of({"State": {"Pid": "1"}}) is None
    assert memory._pid_of({}) is None
    assert memory._pid_of({"State": {"Pid": 42}}) == 42
