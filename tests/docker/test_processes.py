"""Started processes where commands go by plain `docker exec` (no executor): a terminal is
refused with the reason, before any command runs; without one, a process works as on the
executor (the conformance suite's docker-plain target checks that). Its signals go through
the in-container killer: a root sandbox that makes it flood cannot grow our memory or hold
the signal past its deadline; a stop signal leaves it stopped."""

from __future__ import annotations

import signal
import time

import pytest

from orchestrator import Runtime, UsageError
from orchestrator.backends.container.executor import plain
from orchestrator.errors import NoTerminal, SandboxUnavailable
from tests.docker.conftest import MakeEnv, spawn_in_mode


def test_plain_exec_refuses_a_terminal_with_the_reason(make_env: MakeEnv) -> None:
    with spawn_in_mode("plain", make_env("", name="plaintty")) as rt:
        with pytest.raises(NoTerminal, match="needs the in-container executor"):
            rt.start("echo never > ran", tty=True)  # (refused at once: nothing runs)
        assert issubclass(NoTerminal, UsageError)
        assert rt.execute("cat ran 2>/dev/null || echo absent").stdout == "absent\n"
        with rt.start("cat", tty=False) as fine:  # without a terminal: as on the executor
            fine.write("still works\n")
            fine.close_stdin()
            assert fine.wait(60).stdout == "still works\n"


# The sandbox's /bin/sh, replaced by a root sandbox: the in-container killer (a `sh -c`)
# prints without end instead of killing
FLOODING_SH = r"""#!/bin/dash.real
case "$2" in *orchestrator-killed*) exec python3 -c 'import os
b = b"A" * (1 << 20)
while True: os.write(1, b)' ;; esac
exec /bin/dash.real "$@"
"""


def _replace_sh(rt: Runtime, script: str) -> None:
    """The sandbox's /bin/sh replaced by `script` (which runs dash, kept as /bin/dash.real)."""
    rt.write_file("/tmp/sh", script)
    rt.execute(
        "cp /bin/dash /bin/dash.real && install -m 755 /tmp/sh /bin/sh.new && "
        "mv -f /bin/sh.new /bin/sh",
        check=True,
    )


def _rss() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))


def test_a_killer_made_to_flood_cannot_grow_our_memory_nor_outlast_its_deadline(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root sandbox makes the plain path's killer print without end: a signal (and the
    kill after it) keeps at most the killer's tail and ends within its deadline (shortened
    here from KILL_TIMEOUT: the flood runs the whole of it, twice, and a deadline is one
    whatever its length), and a timed-out command's whole kill within 1.5 times it, said
    as unfinished (review: a `timeout=1` call took twice KILL_TIMEOUT, and returned as a
    plain time-out)."""
    deadline = 10.0
    monkeypatch.setattr(plain, "KILL_TIMEOUT", deadline)
    with spawn_in_mode("plain", make_env("user: root\n", name="flood")) as rt:
        _replace_sh(rt, FLOODING_SH)
        # it says when it runs (a fixed pause could end before it started on a busy machine)
        proc = rt.start(["sh", "-c", "echo up; exec sleep 12"], stdin=False, timeout=60)
        up = proc.read(30)
        assert up is not None and up.text == "up\n", f"the command never started: {up}"
        before, started = _rss(), time.monotonic()
        proc.signal(signal.SIGUSR1)
        assert time.monotonic() - started < deadline + 5
        assert _rss() - before < 64 * 1024 * 1024
        proc.kill()
        proc.wait(60)  # (its killer is the sandbox's: it may only end at its own end)
        # a timed-out command's kill is bounded as a whole (SIGTERM half the deadline, then
        # SIGKILL the deadline), and one that could not end is said, never taken for a kill
        started = time.monotonic()
        with pytest.raises(SandboxUnavailable, match="its kill did not end"):
            rt.execute(["sleep", "60"], timeout=1)
        # (and the engine calls after its deadlines: 6.6 s of them once, in a full run)
        assert time.monotonic() - started < 1 + 1.5 * deadline + 10


# The sandbox's /bin/sh, replaced by a root sandbox: the killer ends at once, doing nothing
QUITTING_SH = r"""#!/bin/dash.real
case "$2" in *orchestrator-killed*) exit 0 ;; esac
exec /bin/dash.real "$@"
"""


def test_a_killer_made_to_quit_is_said_not_taken_for_a_kill(make_env: MakeEnv) -> None:
    """ATTACK (review: a root sandbox's /bin/sh that exits at once for the killer made a
    timed-out call return as killed while its command ran on): the call raises
    SandboxUnavailable, and says its processes may still run."""
    with spawn_in_mode("plain", make_env("user: root\n", name="quits")) as rt:
        _replace_sh(rt, QUITTING_SH)
        with pytest.raises(SandboxUnavailable, match="its processes may still run"):
            rt.execute(["sleep", "77"], timeout=1)


def test_sigstop_on_the_plain_path_stops_and_sigcont_resumes(make_env: MakeEnv) -> None:
    """The killer freezes what it signals while it looks: a stop signal must leave it
    stopped (as the executor and the local backend do), and a later one resume it."""
    with spawn_in_mode("plain", make_env("", name="stop")) as rt:
        proc = rt.start("while :; do echo tick; sleep 0.1; done", stdin=False, timeout=60)
        assert proc.read(30) is not None
        proc.signal(signal.SIGSTOP)
        while proc.read(0.5) is not None:  # what it printed before the stop
            pass
        assert proc.read(1.5) is None, "it ran on after SIGSTOP"
        proc.signal(signal.SIGCONT)
        assert proc.read(30) is not None
        proc.kill()
        assert proc.wait(60).exit_code == 137


SLOW_PYTHON = '#!/bin/sh\nsleep 4\nexec /usr/bin/python3 "$@"\n'
"""A python3 first on the sandbox's PATH that takes 4 s to start: a new executor is slow."""


def test_a_terminal_asked_on_the_event_loop_does_not_hold_it(make_env: MakeEnv) -> None:
    """ATTACK (a root sandbox makes its executor slow to start): whether a sandbox can give
    a terminal may start its executor; awaited, that happens off the event loop, which
    goes on meanwhile."""
    import asyncio
    import subprocess
    import sys

    from orchestrator import aio

    cli = [sys.executable, "-m", "orchestrator"]
    up = subprocess.run(
        [*cli, "up", str(make_env("", name="slowpy"))], capture_output=True, text=True
    )
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        plant = (
            f"printf '{SLOW_PYTHON}' > /usr/local/bin/python3 && chmod 755 /usr/local/bin/python3"
        )
        done = subprocess.run([*cli, "exec", ident, "--", "sh", "-c", plant], capture_output=True)
        assert done.returncode == 0, done.stderr

        async def scenario() -> float:
            gaps = [0.0]

            async def tick() -> None:
                last = time.monotonic()
                while True:
                    await asyncio.sleep(0.01)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

            ticker = asyncio.ensure_future(tick())
            try:
                async with await aio.attach(ident) as rt:
                    proc = await rt.start(["sh", "-c", "echo on-a-terminal"], tty=True)
                    result = await proc.wait(60)
                    assert "on-a-terminal" in result.stdout
            finally:
                ticker.cancel()
            return max(gaps)

        assert asyncio.run(scenario()) < 1.0
    finally:
        subprocess.run([*cli, "down", ident], capture_output=True)
