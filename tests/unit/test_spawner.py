"""The executor's spawners, on this machine (they are standard-library Python, the same here
as in a container): a command started through one runs as its user, in a session of its own,
with Python's ignored signals back at their defaults; a spawner that names a process it did
not start is given up; one killed takes its commands with it, reported as killed."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import orchestrator

EXECUTOR = Path(orchestrator.__file__).parent / "backends" / "container" / "executor"
NOBODY = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a spawner switches user: these tests need root on this machine"
)


@pytest.fixture(scope="module")
def mod() -> Iterator[ModuleType]:
    """spawner.py as the executor imports it (beside the procutil package, as top-level modules)."""
    sys.path[:0] = [str(EXECUTOR), str(EXECUTOR.parents[2])]
    try:
        yield importlib.import_module("spawner")
    finally:
        del sys.path[:2]


@pytest.fixture
def spawner(mod: ModuleType) -> Iterator[object]:
    made = mod.Spawner(NOBODY, NOBODY)
    try:
        yield made
    finally:
        made.close()


def run(spawner: object, argv: list[str], stdin: object = None) -> tuple[int, bytes, bytes, int]:
    child = spawner.start(argv, dict(os.environ), "/", stdin, None)  # type: ignore[attr-defined]
    with child.stdout, child.stderr:
        out, err = child.stdout.read(), child.stderr.read()
    return child.wait(), out, err, child.pid


def close(child: object) -> None:
    for pipe in (child.stdin, child.stdout, child.stderr):  # type: ignore[attr-defined]
        if pipe is not None:
            pipe.close()


def test_a_command_runs_as_the_spawners_user_in_its_own_session(spawner: object) -> None:
    code, out, err, _ = run(spawner, ["sh", "-c", "id -u; id -G"])
    assert code == 0, err
    lines = out.decode().split()
    assert lines[0] == str(NOBODY) and lines[1] == str(NOBODY), out  # no extra groups
    assert spawner.pid != os.getpid()  # type: ignore[attr-defined]


def test_exit_codes_and_signals_come_back_as_popen_gives_them(spawner: object) -> None:
    assert run(spawner, ["sh", "-c", "exit 7"])[0] == 7
    assert run(spawner, ["sh", "-c", "kill -TERM $$"])[0] == -signal.SIGTERM
    code, out, err, _ = run(spawner, ["sh", "-c", "yes | head -n 1"])
    assert (code, out, err) == (0, b"y\n", b""), err  # SIGPIPE is back at its default


def test_a_missing_command_is_the_error_popen_raises(spawner: object) -> None:
    clean = {"PATH": "/usr/bin:/bin"}  # this machine's PATH has folders nobody may search
    with pytest.raises(FileNotFoundError):
        spawner.start(["no-such-command-here"], clean, "/", None, None)  # type: ignore[attr-defined]
    with pytest.raises(OSError):
        spawner.start(["true"], dict(os.environ), "/no/such/dir", None, None)  # type: ignore[attr-defined]
    assert run(spawner, ["true"])[0] == 0  # and the spawner is still there


def test_stdin_reaches_the_command(spawner: object) -> None:
    child = spawner.start(["cat"], dict(os.environ), "/", True, None)  # type: ignore[attr-defined]
    child.stdin.write(b"hello")
    child.stdin.close()
    assert child.stdout.read() == b"hello" and child.wait() == 0
    close(child)


def test_a_spawner_naming_another_process_is_not_believed(spawner: object) -> None:
    assert not spawner._started(1)  # type: ignore[attr-defined]
    assert not spawner._started(os.getpid())  # type: ignore[attr-defined]
    with subprocess.Popen(["sleep", "5"]) as ours:  # our child, not the spawner's
        assert not spawner._started(ours.pid)  # type: ignore[attr-defined]
        ours.kill()
    child = spawner.start(["sleep", "5"], dict(os.environ), "/", None, None)  # type: ignore[attr-defined]
    assert spawner._started(child.pid)  # type: ignore[attr-defined]
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    close(child)


def test_a_killed_spawner_takes_its_commands_and_says_so(mod: ModuleType, spawner: object) -> None:
    child = spawner.start(["sleep", "30"], dict(os.environ), "/", None, None)  # type: ignore[attr-defined]
    os.kill(spawner.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    start = time.monotonic()
    assert child.wait() == -signal.SIGKILL and time.monotonic() - start < 5
    assert spawner.dead  # type: ignore[attr-defined]
    close(child)
    with pytest.raises(OSError):
        spawner.start(["true"], dict(os.environ), "/", None, None)  # type: ignore[attr-defined]
    time.sleep(0.2)
    assert (
        not os.path.exists(f"/proc/{child.pid}")
        or b"sleep" not in Path(f"/proc/{child.pid}/cmdline").read_bytes()
    )


def test_a_stopped_spawner_is_continued(spawner: object) -> None:
    os.kill(spawner.pid, signal.SIGSTOP)  # type: ignore[attr-defined]
    start = time.monotonic()
    assert run(spawner, ["true"])[0] == 0
    assert time.monotonic() - start < 5


def test_spawners_are_made_once_per_user_and_bounded(mod: ModuleType) -> None:
    made = mod.Spawners()
    try:
        first = made(["true"], dict(os.environ), "/", NOBODY, NOBODY, None, None)
        again = made(["true"], dict(os.environ), "/", NOBODY, NOBODY, None, None)
        assert first.spawner is again.spawner and first.wait() == again.wait() == 0
        close(first)
        close(again)
        for uid in range(1, mod.MAX_SPAWNERS):
            one = made(["true"], dict(os.environ), "/", 60000 + uid, 60000 + uid, None, None)
            assert one.wait() == 0
            close(one)
        assert made(["true"], dict(os.environ), "/", 61000, 61000, None, None) is None
    finally:
        for one in made.by_ids.values():
            one.close()


def test_an_ended_command_keeps_its_pid_until_the_executor_has_its_exit(
    spawner: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executor kills by pid, as root: a pid released before it knew of the exit could
    be another process's by the time it kills (a spawner slowed down by the sandbox)."""
    held: list[dict[str, int]] = []
    send = spawner._send  # type: ignore[attr-defined]

    def hold(msg: dict[str, int], fds: tuple[int, ...] = ()) -> None:
        if "reap" in msg:
            held.append(msg)
        else:
            send(msg, fds)

    monkeypatch.setattr(spawner, "_send", hold)
    code, _, _, pid = run(spawner, ["true"])
    assert code == 0 and held == [{"reap": pid}]
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state == "Z"  # ended, reported, and still holding its pid
    send(held[0])
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{pid}")


def test_a_spawner_that_answers_nonsense_is_not_believed(mod: ModuleType, spawner: object) -> None:
    """A spawner's SIGINT (Python's KeyboardInterrupt) once made it answer a start with a
    farewell that read as "could not start" while the command ran on, untracked."""
    spawner.reply = None  # type: ignore[attr-defined]
    ask = spawner._ask  # type: ignore[attr-defined]

    def farewell(req: object, fds: object) -> dict[str, object]:
        ask(req, fds)  # it did start the command
        return {"ready": False, "error": "KeyboardInterrupt()"}

    spawner._ask = farewell  # type: ignore[attr-defined]
    with pytest.raises(mod.procutil.Lost):
        spawner.start(["sleep", "30"], dict(os.environ), "/", None, None)  # type: ignore[attr-defined]
    assert spawner.dead  # type: ignore[attr-defined]


def test_a_spawner_does_not_catch_sigint(spawner: object) -> None:
    """Its user may send it SIGINT: it dies of it (a loss the executor handles), where
    Python's KeyboardInterrupt would have had it answer a start with a farewell."""
    status = Path(f"/proc/{spawner.pid}/status").read_text()  # type: ignore[attr-defined]
    caught = int(
        next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16
    )
    assert not caught & (1 << (signal.SIGINT - 1))
    assert caught & (1 << (signal.SIGCHLD - 1))  # what it does catch, read the same way


def test_exits_are_seen_without_a_single_wakeup(
    mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under gVisor a process of the user may read the spawner's wakeup pipe empty: a
    spawner that never hears SIGCHLD still reports each exit, within its POLL."""
    monkeypatch.setattr(mod.signal, "set_wakeup_fd", lambda fd: -1)  # the fork inherits it
    deaf = mod.Spawner(NOBODY, NOBODY)
    try:
        for expected in (0, 3):
            start = time.monotonic()
            code, _, _, _ = run(deaf, ["sh", "-c", f"exit {expected}"])
            assert code == expected and time.monotonic() - start < 2 * mod.POLL + 1
    finally:
        deaf.close()
