"""An owned executor whose greeting comes late (a loaded machine): the host takes it, and
says OWN, only if it has not given up on it yet, and once it has said OWN it never gives
up on it for lateness. Otherwise a close that lost its RELEASE (its `docker exec` killed)
left an executor that stopped the sandbox the host had just fallen back to plain exec in.
A stand-in executor here logs the frames it reads."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from orchestrator.backends.container.executor import wire
from orchestrator.backends.container.executor.client import ExecutorClient

WIRE = Path(wire.__file__).parent
STAND_IN = f"""
import json, os, sys, time
sys.path.insert(0, {str(WIRE)!r})
import wire
greet, answer, log = float(sys.argv[1]), float(sys.argv[2]), open(sys.argv[3], "a", buffering=1)
time.sleep(greet)
info = {{"pid": os.getpid(), "direct": True, "setuid": True}}
sys.stdout.buffer.write(wire.pack(wire.READY, 0, json.dumps(info).encode()))
sys.stdout.buffer.flush()
while True:
    frame = wire.read_frame(sys.stdin.buffer)
    if frame is None:
        log.write("EOF\\n")
        break
    log.write({{wire.OWN: "OWN", wire.DIRECT: "DIRECT", wire.RELEASE: "RELEASE"}}.get(
        frame[0], str(frame[0])) + "\\n")
    if frame[0] == wire.DIRECT:
        time.sleep(answer)  # loaded: its answer comes late, within the meeting's bound
        sys.stdout.buffer.write(wire.pack(wire.NOT_SWITCHED, 0, b"no socket here"))
        sys.stdout.buffer.flush()
"""


def _client(tmp_path: Path, greet: float, answer: float) -> tuple[ExecutorClient, Path]:
    script, log = tmp_path / "stand_in.py", tmp_path / "frames.log"
    script.write_text(STAND_IN)
    shared = tmp_path / "io" / "main"
    shared.mkdir(parents=True, mode=0o700)
    argv = [sys.executable, str(script), str(greet), str(answer), str(log)]
    client = ExecutorClient(argv, direct=(shared, "/.orchestrator-io"), owned=True)
    client.start()
    return client, log


def _frames(log: Path) -> list[str]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = log.read_text().split() if log.exists() else []
        if lines and lines[-1] == "EOF":
            return lines
        time.sleep(0.05)
    raise AssertionError(f"the stand-in never read its end: {log.read_text()!r}")


def test_a_greeting_taken_before_the_give_up_is_waited_out_not_dropped(tmp_path: Path) -> None:
    """Greeted in time for OWN, but its meeting (DIRECT) outlasts the host's wait: the host
    waits the meeting out and keeps it, rather than closing an executor it said OWN to."""
    client, log = _client(tmp_path, greet=0.2, answer=1.5)
    try:
        assert not client.wait_ready(0.6)  # greeted, its answer to DIRECT not yet come
        assert client.greeted_late()
        assert client.ready_now and client.transport.startswith("pipes")
    finally:
        client.close()
    assert _frames(log) == ["OWN", "DIRECT", "RELEASE", "EOF"]


def test_a_greeting_after_the_give_up_is_never_taken(tmp_path: Path) -> None:
    """Greeted after the host gave up: no OWN, so the end of its input (however the close
    went) stops nothing."""
    client, log = _client(tmp_path, greet=1.0, answer=0.0)
    try:
        assert not client.wait_ready(0.2)
        assert not client.greeted_late()
        time.sleep(1.5)  # its greeting comes now
    finally:
        client.close()
    frames = _frames(log)
    assert "OWN" not in frames and "DIRECT" not in frames, frames


def test_closing_an_executor_that_never_greeted_waits_for_no_meeting(tmp_path: Path) -> None:
    """No greeting taken, no meeting under way: the close sends RELEASE at once and ends
    the executor within its own 2 s, rather than waiting out a meeting that cannot come
    (19 s, on top of the 15 s the host already waited for the greeting)."""
    client, _ = _client(tmp_path, greet=60.0, answer=0.0)
    assert not client.wait_ready(0.2)
    assert not client.greeted_late()
    started = time.monotonic()
    client.close()
    assert time.monotonic() - started < 5
