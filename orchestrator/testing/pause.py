"""The pause profile: `rt.pause()` freezes every process of the environment where it is and
`rt.resume()` lets them run on. `from orchestrator.testing.pause import *` in a test module
with a `conformance_target` fixture runs these checks:

- a process ticking in the background does not tick while paused, and ticks on (the same
  process) after resume;
- while paused every call that would run something raises SandboxPaused at once, and calls
  that ask nothing of the sandbox (info, poll, paused) work; pause and resume are idempotent;
- a command in flight when the environment is paused fails with SandboxPaused (through the
  executor within about two seconds; by plain `docker exec`, which has no silence to probe,
  at the command's own deadline), and is gone after resume (rule "pause-in-flight": it is
  killed while paused, and dies at the thaw);
- kill() and cleanup() of a paused environment work.

A backend that cannot pause at all lists the rule "pause"; the profile skips."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator import Runtime, RuntimeClosed, SandboxPaused, SandboxUnavailable
from orchestrator.testing.target import Target

__all__ = [
    "paused_rt",
    "test_pause_calls_fail_fast_until_resume",
    "test_pause_command_in_flight_fails_and_is_gone_after_resume",
    "test_pause_freezes_every_process_and_resume_lets_them_run_on",
    "test_pause_kill_and_cleanup_of_a_paused_environment",
]

TICKER = "while :; do cut -d' ' -f1 /proc/uptime >> .pause-ticks; sleep 0.05; done"
"""A background process appending the kernel's uptime (the host's clock too: one kernel)
to a file in the workdir twenty times a second (at most)."""


@pytest.fixture
def paused_rt(conformance_target: Target, tmp_path: Path) -> Iterator[Runtime]:
    """A runtime of its own (these checks pause, kill and close it)."""
    reason = conformance_target.deviation("pause")
    if reason:
        pytest.skip(f"{conformance_target.id} deviates from 'pause': {reason}")
    runtime = conformance_target.spawn(tmp_path)
    try:
        yield runtime
    finally:
        runtime.cleanup()


def _until(check: Callable[[], object], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _ticks(rt: Runtime) -> list[float]:
    """The ticker's times so far (whole lines only: the last may be half written)."""
    text = rt.execute("cat .pause-ticks").stdout
    return [float(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _uptime() -> float:
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def test_pause_freezes_every_process_and_resume_lets_them_run_on(paused_rt: Runtime) -> None:
    """No tick between the moment pause() returned and the moment resume() was called: a
    frozen process cannot run, however busy the machine (a rate could not tell)."""
    rt = paused_rt
    pid = rt.execute(f'nohup sh -c "{TICKER}" >/dev/null 2>&1 & echo $!').stdout.strip()
    assert _until(lambda: len(_ticks(rt)) >= 3, 30), "the ticker never ticked"
    rt.pause()
    frozen_at = _uptime()
    assert rt.paused
    time.sleep(2)
    thawing_at = _uptime()
    rt.resume()
    assert not rt.paused
    assert _until(lambda: _ticks(rt)[-1] > thawing_at, 30), "no tick after resume"
    during = [t for t in _ticks(rt) if frozen_at + 0.02 < t < thawing_at]
    assert during == [], f"ticked while paused ({frozen_at:.2f} to {thawing_at:.2f}): {during}"
    assert rt.execute(f"kill -0 {pid}").ok  # the same process


def test_pause_calls_fail_fast_until_resume(paused_rt: Runtime, tmp_path: Path) -> None:
    rt = paused_rt
    rt.write_file("kept.txt", "kept\n")
    rt.pause()
    rt.pause()
    calls: dict[str, Callable[[], object]] = {
        "execute": lambda: rt.execute("true"),
        "stream": lambda: list(rt.stream("true")),
        "read_file": lambda: rt.read_file("kept.txt"),
        "write_file": lambda: rt.write_file("new.txt", "x"),
        "download": lambda: rt.download(".", tmp_path / "down"),
        "snapshot": lambda: rt.snapshot(tmp_path / "snap.tar"),
    }
    for name, call in calls.items():
        started = time.monotonic()
        with pytest.raises(SandboxPaused):
            call()
        assert time.monotonic() - started < 5, f"{name} took its time to refuse"
    assert issubclass(SandboxPaused, SandboxUnavailable)
    assert rt.paused and rt.poll() is None and rt.info().id
    rt.resume()
    rt.resume()
    assert not rt.paused and rt.read_file("kept.txt") == "kept\n"


def test_pause_command_in_flight_fails_and_is_gone_after_resume(
    paused_rt: Runtime, conformance_target: Target
) -> None:
    reason = conformance_target.deviation("pause-in-flight")
    if reason:
        pytest.skip(f"{conformance_target.id} deviates from 'pause-in-flight': {reason}")
    rt = paused_rt
    out: list[object] = []

    def run() -> None:
        try:
            out.append(rt.execute("echo started > .in-flight; sleep 31234", timeout=8))
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert _until(lambda: rt.execute("cat .in-flight").ok, 30)
    rt.pause()
    thread.join(30)  # the executor: within ~2 s; plain exec: at the command's deadline
    assert not thread.is_alive() and isinstance(out[0], SandboxPaused), out
    rt.resume()
    probe = "for f in /proc/[0-9]*/cmdline; do grep -l '3123[4]' $f; done 2>/dev/null; true"
    assert _until(lambda: not rt.execute(probe).stdout.strip(), 15)
    assert rt.execute("echo on").stdout == "on\n"


def test_pause_kill_and_cleanup_of_a_paused_environment(
    paused_rt: Runtime, conformance_target: Target, tmp_path: Path
) -> None:
    rt = paused_rt
    rt.pause()
    rt.kill()
    assert _until(lambda: rt.poll() is not None, 30)
    rt.cleanup()
    with pytest.raises(RuntimeClosed):
        rt.execute("true")
    other = conformance_target.spawn(tmp_path / "other")
    try:
        other.pause()
    finally:
        started = time.monotonic()
        other.cleanup()
    assert time.monotonic() - started < 60 and other.closed
