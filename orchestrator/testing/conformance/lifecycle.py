"""The conformance checks of an environment's life: setup commands, cleanup, poll and kill,
bounded memory while a command prints, snapshots and restore."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from orchestrator import Runtime, RuntimeResult
from orchestrator.errors import (
    RuntimeClosed,
    SetupFailed,
)
from orchestrator.testing.conformance.kit import MiB, unique_sleep
from orchestrator.testing.target import Target, stat_argv


# ----- setup ---------------------------------------------------------------------------------
def test_setup_ran_once_and_output_kept_apart(rt: Runtime) -> None:
    assert rt.setup_result is not None and "setup-marker" in rt.setup_result.stdout
    assert rt.execute("cat .setup-count").stdout == "ran\n"
    r = rt.execute("echo mine")
    assert r.stdout == "mine\n" and "setup-marker" in r.setup_stdout


def test_eval_commands_only_for_evaluation(rt: Runtime) -> None:
    assert rt.execute("cat .eval-count").exit_code != 0


def test_evaluation_and_disabled_setup(conformance_target: Target, tmp_path: Path) -> None:
    with conformance_target.spawn(tmp_path / "a", is_evaluation=True) as rt:
        assert rt.execute("cat .eval-count").stdout == "eval\n"
    with conformance_target.spawn(tmp_path / "b", disable_setup=True) as rt:
        assert rt.setup_result is None and rt.execute("cat .setup-count").exit_code != 0


def test_failing_setup_raises_with_output(conformance_target: Target, tmp_path: Path) -> None:
    with pytest.raises(SetupFailed) as info:
        conformance_target.spawn(tmp_path, setup=("echo ok", "echo boom >&2; exit 9"))
    assert info.value.result_exit_code == 9 and "boom" in info.value.stderr


# ----- lifecycle -----------------------------------------------------------------------------
def test_cleanup_is_idempotent_and_closes(fresh: Runtime) -> None:
    fresh.cleanup()
    fresh.cleanup()
    for call in (
        lambda: fresh.execute("true"),
        lambda: fresh.read_file("x"),
        lambda: fresh.write_file("x", "y"),
        fresh.poll,
        fresh.kill,
    ):
        with pytest.raises(RuntimeClosed):
            call()


def _poll_until_down(rt: Runtime, within: float = 10.0) -> int | None:
    deadline = time.monotonic() + within
    while (status := rt.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return status


def test_poll_and_kill(fresh: Runtime) -> None:
    fresh.execute(f"setsid sleep {unique_sleep()} >/dev/null 2>&1 < /dev/null &")
    assert fresh.poll() is None
    fresh.kill()
    assert _poll_until_down(fresh) == 137  # down, as by SIGKILL: the daemon died too
    with pytest.raises(RuntimeClosed):
        fresh.execute("true")


def test_kill_stops_running_commands(fresh: Runtime) -> None:
    s = unique_sleep()
    results: list[RuntimeResult] = []
    t = threading.Thread(target=lambda: results.append(fresh.execute(f"sleep {s}", timeout=60)))
    t.start()
    time.sleep(1.0)
    started = time.monotonic()
    fresh.kill()
    t.join(20)
    assert not t.is_alive()
    [result] = results  # it ended with a result, not an exception in its thread
    assert result.exit_code == 137 and not result.timed_out and not result.ok
    assert time.monotonic() - started < 10


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_memory_stays_bounded_while_a_command_prints_a_quarter_gigabyte(rt: Runtime) -> None:
    """Output that piled up anywhere would grow us by 256 MiB, far more than the bound."""
    base, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        r = rt.execute("head -c 268435456 /dev/zero; echo tail", output_limit=MiB, timeout=300)
    finally:
        done.set()
        sampler.join()
    assert r.exit_code == 0 and r.truncated and r.stdout.endswith("\x00tail\n")
    assert peak[0] - base < 150 * MiB, f"grew by {(peak[0] - base) // MiB} MiB"


# ----- snapshots -----------------------------------------------------------------------------
def test_snapshot_and_resume(conformance_target: Target, tmp_path: Path) -> None:
    with conformance_target.spawn(tmp_path / "a") as first:
        first.write_file("work/notes.txt", "kept\n")
        first.execute("mkdir -p work/empty && ln -s notes.txt work/link && chmod 700 work")
        snap = first.snapshot(tmp_path / "snaps" / "one.tar")
    assert snap.path.is_file() and snap.size > 0 and snap.env == f"conf-{conformance_target.id}"
    with conformance_target.spawn(tmp_path / "b", resume=snap) as second:
        assert second.read_file("work/notes.txt") == "kept\n"
        assert second.execute(["readlink", "work/link"]).stdout == "notes.txt\n"
        assert second.execute(stat_argv("%a", "work")).stdout == "700\n"
        assert second.execute("test -d work/empty").exit_code == 0
        # setup's own commands did not run again; the resume commands did
        assert second.read_file(".setup-count") == "ran\n"
        assert second.read_file(".resume-count") == "resumed\n"
    snap.remove()
    assert not snap.path.exists() and not snap.record.exists()


def _running(rt: Runtime, needle: str) -> bool:
    """Whether a process whose command line holds `needle` runs where rt's commands run."""
    scan = 'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < "$f" 2>/dev/null; echo; done'
    return needle in rt.execute(scan).stdout


def test_restore_kills_every_process_and_puts_the_workspace_back(
    fresh: Runtime, tmp_path: Path
) -> None:
    fresh.write_file("work/kept.txt", "before\n")
    snap = fresh.snapshot(tmp_path / "base.tar")
    daemon, child = unique_sleep(), unique_sleep()
    fresh.execute(f"setsid sleep {daemon} >/dev/null 2>&1 < /dev/null &")
    fresh.execute(f"sleep {child} >/dev/null 2>&1 < /dev/null &")
    fresh.write_file("work/kept.txt", "changed\n")
    fresh.execute("echo x > new.txt && mkdir -p locked/in && chmod 000 locked work")
    assert _running(fresh, f"sleep {daemon}") and _running(fresh, f"sleep {child}")
    fresh.restore(snap)
    assert fresh.poll() is None  # still up, and usable
    assert not _running(fresh, f"sleep {daemon}") and not _running(fresh, f"sleep {child}")
    assert fresh.read_file("work/kept.txt") == "before\n"
    assert fresh.execute("ls -A").stdout.split() == sorted([".setup-count", ".static-copy", "work"])
    assert fresh.read_file(".setup-count") == "ran\n"  # no setup command ran again
