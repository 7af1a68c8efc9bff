"""Kept processes (`Sandbox.start(keep=True)`, `Sandbox.process(id)`; executor/kept.py): a
process that outlives the Process and the OS process that started it, read again from a
cursor by another OS process; its output bounded by the scrollback whoever reads; and what a
caller cannot do with it (a forged id, an environment without an endpoint)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from orchestrator import (
    OrchestratorError,
    ProcessNotFound,
    Runtime,
    UsageError,
    attach,
    spawn_runtime,
)
from orchestrator.sandbox.process import Process
from tests.docker.conftest import MakeEnv

pytestmark = pytest.mark.docker
WITHIN = 60.0


@pytest.fixture
def detached(make_env: MakeEnv) -> Iterator[Runtime]:
    """A detached environment (it has an endpoint), its user uid 1000."""
    rt = spawn_runtime(make_env("user: '1000:1000'\n", name="kept"), detached=True)
    try:
        yield rt
    finally:
        rt.cleanup()


def _until(proc: Process, marker: bytes) -> bytes:
    """Output read until `marker` came (AssertionError after WITHIN s)."""
    got, deadline = b"", time.monotonic() + WITHIN
    while marker not in got:
        event = proc.read(max(0.0, deadline - time.monotonic()))
        assert event is not None and event.kind != "finished", got
        got += event.data
    return got


def _in_another_process(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=WITHIN * 2,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_kept_repl_outlives_its_starter_and_is_read_again_from_a_cursor(
    detached: Runtime,
) -> None:
    ident = detached.info().id
    # an OS process starts a Python REPL, kept, feeds it a line, notes where it read to,
    # and dies by SIGKILL (no goodbye of any kind)
    code = textwrap.dedent(f"""
        import os, signal
        from orchestrator import attach
        rt = attach({ident!r})
        p = rt.start(["python3", "-iqu"], keep=True)
        p.write("x = 20\\nprint('first', x + 1)\\n")
        got = b""
        while b"first 21" not in got:
            got += p.read(60).data
        print(p.id, p.cursor, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WITHIN * 2
    )
    assert done.returncode == -9, done.stderr
    pid, cursor = done.stdout.split()
    assert int(cursor) > 0

    # another OS process: from the cursor on, only what came after; the REPL's state kept
    later = _in_another_process(f"""
        from orchestrator import attach
        p = attach({ident!r}).process({pid!r}, cursor={cursor})
        p.write("print('second', x * 2)\\n")
        got = b""
        while b"second 40" not in got:
            got += p.read(60).data
        print(repr(got), p.cursor)
    """)
    seen, after = later.rsplit(" ", 1)
    assert "first" not in seen and "second 40" in seen
    assert int(after) > int(cursor)

    # this process: from 0, everything (both lines), then the end of its input ends it
    again = attach(ident).process(pid)
    assert b"first 21" in _until(again, b"second 40")
    again.close_stdin()
    result = again.wait(WITHIN)
    assert result.exit_code == 0 and "second 40" in result.stdout
    assert again.cursor >= int(after)
    # ended and read: a reader that comes later still gets its end (until it is forgotten)
    assert attach(ident).process(pid).wait(WITHIN).exit_code == 0


def test_a_forged_or_malformed_id_gets_nothing(detached: Runtime) -> None:
    with pytest.raises(ProcessNotFound):
        detached.process("0" * 32).wait(WITHIN)
    real = detached.start(["sleep", "30"], keep=True)
    try:
        assert real.id is not None
        near = real.id[:-1] + ("0" if real.id[-1] != "0" else "1")
        with pytest.raises(ProcessNotFound):
            detached.process(near).wait(WITHIN)
        for bad in ("", real.id.upper(), real.id + "0", "../" + real.id[3:], 7):
            with pytest.raises(UsageError):
                detached.process(bad)  # type: ignore[arg-type]
        with pytest.raises(UsageError):
            detached.process(real.id, cursor=-1)
    finally:
        real.kill()
        assert real.wait(WITHIN).exit_code == 137


def test_keep_is_refused_before_anything_runs_without_an_endpoint(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("", name="kept-owned")) as rt:  # owned by this process: none
        with pytest.raises(UsageError, match="detached"):
            rt.start(["touch", "/tmp/ran"], keep=True)
        with pytest.raises(UsageError, match="detached"):
            rt.process("a" * 32)
        assert rt.execute(["test", "-e", "/tmp/ran"]).exit_code == 1


def test_a_flood_nobody_reads_is_held_to_the_scrollback(detached: Runtime) -> None:
    """64 MiB printed with no reader: the resident holds at most its scrollback (its memory
    does not grow with the output), a reader from 0 is told what was dropped (its cursor
    counts it), and gets the last bytes whole."""
    go = f"/tmp/flood-go-{uuid.uuid4().hex[:8]}"  # it ends once told: after the checks below
    code = (
        "import os, sys, time\nfor i in range(1024): sys.stdout.write('%065535d\\n' % i)\n"
        f"sys.stdout.flush()\nwhile not os.path.exists({go!r}): time.sleep(0.05)"
    )
    flood = detached.start(["python3", "-c", code], keep=True, stdin=False)
    assert flood.id is not None
    assert flood.read(WITHIN) is not None  # it runs (its id is known there)
    flood.detach()  # nobody reads: it runs on
    with pytest.raises(UsageError, match="detached"):
        flood.wait(WITHIN)
    with pytest.raises(UsageError, match="detached"):  # never a kill that does nothing
        flood.kill()
    later = detached.process(flood.id)
    detached.execute(["touch", go])
    result = later.wait(WITHIN)
    assert result.exit_code == 0
    assert later.cursor == 1024 * 65536  # every byte counted, read or dropped
    assert result.stdout.endswith(f"{1023:065535d}\n")
    rss = detached.execute(
        [
            "sh",
            "-c",
            "grep VmRSS $(grep -l -- '[-]-resident' /proc/[0-9]*/cmdline"
            " | sed 's/cmdline/status/')",
        ],
        user="root",
    ).stdout.split()
    assert rss and int(rss[1]) < 64 * 1024, rss  # kB: far below the 64 MiB it printed


def test_a_kept_process_still_dies_at_its_timeout_and_by_kill(detached: Runtime) -> None:
    timed = detached.start(["sh", "-c", "echo up; sleep 300 & sleep 301"], keep=True, timeout=2)
    assert timed.id is not None
    _until(timed, b"up")
    timed.detach()
    result = detached.process(timed.id).wait(WITHIN)
    assert result.timed_out
    left = detached.execute(
        ["sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 30[01]'"]
    )
    assert left.stdout.strip() == "0", left.stdout
    killed = detached.start(["sh", "-c", "echo up; exec sleep 300"], keep=True)
    assert killed.id is not None
    _until(killed, b"up")  # its start reached the sandbox: its id is known there
    other = detached.process(killed.id)
    other.kill()  # any reader may kill it
    assert killed.wait(WITHIN).exit_code == 137


def test_a_cursor_past_the_end_reads_from_the_end(detached: Runtime) -> None:
    echo = detached.start(["sh", "-c", "echo abc; exec cat"], keep=True)
    assert echo.id is not None
    _until(echo, b"abc")
    assert echo.cursor == 4
    far = detached.process(echo.id, cursor=10**15)
    far.write("more\n")
    assert _until(far, b"more") == b"more\n"
    assert far.cursor == 9  # where it is: the end it was moved to, and what came after
    far.kill()
    assert echo.wait(WITHIN).exit_code == 137


def test_a_resident_killed_in_the_sandbox_is_started_again_and_takes_its_orphans_down(
    detached: Runtime,
) -> None:
    """Root in the sandbox kills the resident: its kept processes' timeouts are enforced by
    nobody, so the next resident (started by the next kept call) kills them."""
    orphan = detached.start(["sh", "-c", "echo up; exec sleep 1000"], keep=True, timeout=600)
    assert orphan.id is not None
    _until(orphan, b"up")
    killed = detached.execute(
        ["sh", "-c", "kill -9 $(grep -l -- '[-]-resident' /proc/[0-9]*/cmdline | cut -d/ -f3)"],
        user="root",
    )
    assert killed.ok, killed.stderr
    with pytest.raises(OrchestratorError):
        orphan.wait(WITHIN)  # its connection went with the resident
    again = detached.start(["echo", "again"], keep=True, stdin=False)
    assert again.wait(WITHIN).stdout == "again\n"
    with pytest.raises(ProcessNotFound):  # the new resident does not know it
        detached.process(orphan.id).wait(WITHIN)
    left = detached.execute(
        ["sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 100[0]'"]
    )
    assert left.stdout.strip() == "0"


def test_callers_that_find_the_resident_gone_together_all_get_one_new_one(
    detached: Runtime,
) -> None:
    """Four threads' kept calls after the resident was killed: one starts a new resident,
    the others use it (none is told the environment has no endpoint), and one resident runs
    afterwards."""
    kill = "kill -9 $(grep -l -- '[-]-resident' /proc/[0-9]*/cmdline | cut -d/ -f3)"
    assert detached.execute(["sh", "-c", kill], user="root").ok
    results: list[object] = []

    def one(n: int) -> None:
        try:
            results.append(detached.start(["echo", f"n{n}"], keep=True).wait(WITHIN).stdout)
        except Exception as exc:  # the test's to see
            results.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WITHIN * 2)
    assert sorted(map(str, results)) == [f"n{n}\n" for n in range(4)], results
    count = detached.execute(
        ["sh", "-c", "grep -l -- '[-]-resident' /proc/[0-9]*/cmdline | wc -l"], user="root"
    )
    # (a resident is two processes: it and its spawner of user 1000's commands)
    assert count.stdout.strip() in ("1", "2"), count.stdout
