"""Attacks on a started process (issue 39), on every backend the conformance targets name
that runs on this machine's engine, through both front doors where they differ:

- a process flooding output that nobody reads cannot grow this process's memory past the
  bound (its output waits: a bounded queue of events, the executor's credit, a pipe);
- a caller writing to a process that reads none of its input waits, within its own bound,
  and memory does not grow either;
- a signal or kill asked of a process that ended reaches no other process (its process id
  may be another's by then);
- many signals asked before the command runs are held once each, not one per call;
- a process dropped unread, or whose sandbox was removed under it, leaves no thread."""

from __future__ import annotations

import contextlib
import gc
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import OrchestratorError, Runtime
from orchestrator.procutil import IDLE_WORKERS
from orchestrator.procutil.workers import WORKER_NAME
from orchestrator.sandbox.process import AHEAD
from orchestrator.testing import Target
from orchestrator.testing.conformance.kit import survivors_within
from tests.conformance.test_conformance import TARGETS

MiB = 1024 * 1024
BOUND = 64 * MiB
"""Most this process's resident memory may grow while a flood waits for its reader."""
PICKED = [t for t in TARGETS if t.id in ("local", "docker", "docker-plain", "docker-async")]
TTY = [t.id for t in PICKED if not t.deviation("tty")]


@pytest.fixture(scope="module", params=PICKED, ids=[t.id for t in PICKED])
def conformance_target(request: pytest.FixtureRequest) -> Target:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def rt(conformance_target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    with conformance_target.spawn(tmp_path_factory.mktemp("attack")) as runtime:
        yield runtime


def _rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_an_unread_flood_cannot_grow_our_memory(rt: Runtime) -> None:
    before = _rss()
    proc = rt.start(
        "while :; do cat /proc/self/stat /proc/self/stat /proc/self/stat; done",
        stdin=False,
        timeout=60,
    )
    try:
        highest = before
        for _ in range(30):  # 3 s with nobody reading
            time.sleep(0.1)
            highest = max(highest, _rss())
        assert not proc.ended
        assert highest - before < BOUND, f"grew by {(highest - before) // MiB} MiB"
    finally:
        proc.kill()
    result = proc.wait(60)
    assert result.exit_code == 137
    assert len(result.stdout) <= 16 * MiB  # the tail the result keeps, no more


def test_a_process_that_reads_nothing_makes_its_writer_wait(rt: Runtime) -> None:
    proc = rt.start("sleep 60", timeout=60)
    piece = b"x" * MiB
    before = _rss()
    try:
        written = 0
        with contextlib.suppress(TimeoutError):
            for _ in range(1000):  # 1 GB, were nothing to stop it
                proc.write(piece, timeout=2)
                written += 1
        assert written < 100, f"{written} MiB taken by a command that reads nothing"
        assert _rss() - before < BOUND
    finally:
        proc.kill()
    assert proc.wait(60).exit_code == 137


def test_a_signal_after_the_end_reaches_no_other_process(rt: Runtime) -> None:
    ended = rt.start("true", stdin=False)
    assert ended.wait(60).exit_code == 0
    later = rt.start(
        "trap 'echo hit; exit 9' TERM INT; echo ready; while :; do sleep 0.05; done",
        stdin=False,
        timeout=60,
    )
    try:
        event = later.read(60)
        assert event is not None and event.text == "ready\n"
        for _ in range(20):
            ended.signal(signal.SIGTERM)
            ended.signal(signal.SIGINT)
            ended.kill()
        time.sleep(0.5)
        assert not later.ended
    finally:
        later.kill()
    result = later.wait(60)
    assert (result.exit_code, "hit" in result.stdout) == (137, False)


def test_signals_asked_before_the_start_are_held_once_each(rt: Runtime) -> None:
    """A caller hammering `signal` as it starts: each signal held once (as the kernel holds
    a pending one) and delivered at the start (SIGWINCH: ignored unless caught), the
    process then as usable as any."""
    proc = rt.start(
        "trap 'echo term; exit 4' TERM; echo ready; while :; do sleep 0.05; done",
        stdin=False,
        timeout=60,
    )
    for _ in range(10000):
        proc.signal(signal.SIGWINCH)
    event = proc.read(60)
    assert event is not None and event.text == "ready\n"
    proc.signal(signal.SIGTERM)
    result = proc.wait(60)
    assert result.exit_code == 4 and "term" in result.stdout, result


def _busy_workers() -> int:
    """Threads of the process core at work (idle ones, at most IDLE_WORKERS, wait for jobs)."""
    return sum(t.name == WORKER_NAME for t in threading.enumerate())


def _settled(before: int, seconds: float = 30.0) -> int:
    deadline = time.monotonic() + seconds
    while (now := _busy_workers()) > before + IDLE_WORKERS and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.2)
    return now


def test_dropped_processes_let_go_of_their_threads(rt: Runtime) -> None:
    """Ten floods started and dropped unread, one with its input open: each runs to its end
    (its output drained, its input ended as a pipe's when its writer goes); no thread of
    theirs is left."""
    before = _busy_workers()
    for _ in range(10):  # (each past what a process holds for its reader, and any pipe's)
        rt.start(f"head -c {4 * AHEAD} /dev/zero", stdin=False, timeout=60)
    rt.start("cat; echo input-ended", timeout=60)
    gc.collect()
    # (a full run on two cores drained 200 MB in more than 30 s once: 40 MB now, and as long
    # as their timeouts to end)
    assert _settled(before, 60) <= before + IDLE_WORKERS, [t.name for t in threading.enumerate()]


def test_removing_the_sandbox_lets_go_of_processes_nobody_reads(
    conformance_target: Target, tmp_path: Path
) -> None:
    before = _busy_workers()
    runtime = conformance_target.spawn(tmp_path)
    try:
        held = [runtime.start("while :; do echo flood; done", timeout=120) for _ in range(3)]
        time.sleep(1.0)  # their output waits for a reader that never comes
    finally:
        runtime.cleanup()
    for proc in held:
        with contextlib.suppress(OrchestratorError):
            proc.wait(30)  # ends: removed under it (its result, or why it could not finish)
        assert proc.ended
    assert _settled(before) <= before + IDLE_WORKERS


def test_a_dropped_process_on_a_terminal_is_hung_up(
    conformance_target: Target, rt: Runtime
) -> None:
    """Nobody can type into a dropped terminal any more: its session ends (as at a hang-up),
    instead of waiting for input until its environment goes."""
    if conformance_target.id not in TTY:
        pytest.skip(f"{conformance_target.id} gives no terminal")
    marker = str(30000 + uuid.uuid4().int % 9999)
    rt.start(f"sleep {marker} & cat", tty=True)
    gc.collect()
    assert not survivors_within(rt, f"sleep {marker}", 30)
