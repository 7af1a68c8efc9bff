"""`Runtime.fork(n)` / `orchestrator fork ID -n N` (sandbox/base.py): copies of a running
environment, each under its own id with its own networks, ports and workspace, from its
workspace and every container's filesystem (a service's too) as they are now; the original
runs on untouched; processes are not carried; nothing is left once every copy is gone."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from orchestrator import UsageError, fork, list_snapshots, spawn_runtime
from orchestrator.backends.container import images
from tests.conftest import BUSYBOX_IMAGE, labelled_ids
from tests.docker.conftest import MakeEnv

pytestmark = pytest.mark.docker
CLI = [sys.executable, "-m", "orchestrator"]

BODY = f"""\
setup:
  commands: ['echo setup >> setup.log']
  resume_commands: ['echo resumed >> setup.log']
services:
  db:
    image: {BUSYBOX_IMAGE}
    command: [sleep, '600']
"""


def test_two_copies_carry_files_not_processes_and_leave_the_original_alone(
    make_env: MakeEnv, caplog: pytest.LogCaptureFixture
) -> None:
    before = labelled_ids()
    snaps = {s.name for s in list_snapshots()}
    with spawn_runtime(make_env(BODY, name="forkme")) as rt:
        rt.write_file("work.txt", "mine\n")
        rt.execute("mkdir -p /opt/tool && echo built > /opt/tool/out", user="0:0", check=True)
        rt.service("db").execute("echo row > /tmp/store", check=True)
        rt.execute(["sh", "-c", "sleep 600 & echo started"], check=True)  # a running process
        copies = fork(rt, 2)
        saved = {
            i
            for c in copies
            for i in (c.options.resume.images.values() if c.options.resume else ())
        }
        try:
            ids = {rt.info().id, *(c.info().id for c in copies)}
            assert len(ids) == 3
            for n, copy in enumerate(copies):
                got = copy.execute("cat work.txt /opt/tool/out setup.log").stdout
                assert got == "mine\nbuilt\nsetup\nresumed\n"
                assert copy.service("db").execute("cat /tmp/store").stdout == "row\n"
                # its own service by name, and none of the original's processes
                seen = copy.execute(["getent", "hosts", "db"]).stdout.split()
                own = copy.service("db").execute(["hostname", "-i"]).stdout.split()
                assert seen and own and seen[0] == own[0], (seen, own)
                left = copy.execute(
                    ["sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"]
                ).stdout
                assert "sleep 600" not in left
                copy.write_file("work.txt", f"copy {n}\n")
            # the copies are apart from each other and from the original
            assert [c.read_file("work.txt") for c in copies] == ["copy 0\n", "copy 1\n"]
            assert rt.read_file("work.txt") == "mine\n"
            assert rt.execute("cat setup.log").stdout == "setup\n"
        finally:
            with caplog.at_level(logging.DEBUG, logger="orchestrator"):
                for copy in copies:
                    copy.cleanup()
    assert labelled_ids() <= before
    assert {s.name for s in list_snapshots()} == snaps  # its record went at once
    assert saved and not any(images.exists(i) for i in saved)  # its images with the last copy
    # (the first copy's removal leaves the images the second runs: no news, said at debug)
    reaped = [r for r in caplog.records if "left to the reaper" in r.getMessage()]
    assert not [r for r in reaped if r.levelno >= logging.WARNING], caplog.text


def test_fork_refuses_a_bad_count_before_anything_is_saved(make_env: MakeEnv) -> None:
    snaps = {s.name for s in list_snapshots()}
    with spawn_runtime(make_env("", name="forkbad")) as rt:
        for bad in (0, -1, 65, 1.5, True):
            with pytest.raises(UsageError):
                fork(rt, bad)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="memory"):
            rt.checkpoint(memory=True)
    assert {s.name for s in list_snapshots()} == snaps


def test_cli_fork_prints_each_copy_and_leaves_them_running(make_env: MakeEnv) -> None:
    up = subprocess.run(
        [*CLI, "up", str(make_env("", name="forkcli"))], capture_output=True, text=True, timeout=120
    )
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    made: list[str] = []
    try:
        subprocess.run(
            [*CLI, "exec", ident, "--", "sh", "-c", "echo x > f"], check=True, timeout=60
        )
        done = subprocess.run(
            [*CLI, "fork", ident, "-n", "2"], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        made = done.stdout.split()
        assert len(made) == 2 and ident not in made
        for copy in made:
            got = subprocess.run(
                [*CLI, "exec", copy, "--", "cat", "f"], capture_output=True, text=True, timeout=60
            )
            assert got.stdout == "x\n", got.stderr
        bad = subprocess.run([*CLI, "fork", ident, "-n", "0"], capture_output=True, text=True)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr
    finally:
        for name in [ident, *made]:
            subprocess.run([*CLI, "down", name], capture_output=True, timeout=120)
