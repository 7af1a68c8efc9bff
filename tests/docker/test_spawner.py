"""Commands run as another user than the executor's go through a spawner (one process per
user, forked once, started commands by vfork): on a real engine, under runc and gVisor, they
behave as before (exit codes, stdout and stderr apart, stdin, cwd, a missing command, a
timeout that kills the tree, SIGPIPE at its default), and a sandbox of that user can neither
trace the spawner nor lose a command to it: killed, its command is reported killed and the
next one starts; stopped, it is continued."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from orchestrator import Runtime, spawn_runtime
from tests.conftest import PYTHON_IMAGE

PARENT_UID = "awk '/^Uid:/ {print $2}' /proc/$PPID/status"
TRACE = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "pid = int(sys.argv[1])\n"
    "print(libc.ptrace(16, pid, 0, 0), os.strerror(ctypes.get_errno()))\n"
    "try:\n"
    "    open('/proc/%d/mem' % pid, 'rb').read(1)\n"
    "    print('mem read')\n"
    "except OSError as exc:\n"
    "    print('mem', exc.errno)\n"
)


@pytest.fixture(scope="module", params=["runc", "gvisor"])
def sandbox(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runtime]:
    if request.param == "gvisor":
        request.getfixturevalue("gvisor_engine")
    path = tmp_path_factory.mktemp("sp") / "sp.yaml"
    path.write_text(
        f"version: 1\nname: spawn\nimage: {PYTHON_IMAGE}\nuser: '1000:1000'\n"
        f"isolation: {request.param}\n"
    )
    with spawn_runtime(path) as rt:
        yield rt


def spawner_pid(rt: Runtime) -> int:
    found = rt.execute(["sh", "-c", "echo $PPID; " + PARENT_UID], timeout=20)
    pid, uid = found.stdout.split()
    assert uid == "1000", found  # the command's parent is of its user: a spawner
    return int(pid)


def test_a_users_command_is_started_by_a_spawner_of_that_user(sandbox: Runtime) -> None:
    first, again = spawner_pid(sandbox), spawner_pid(sandbox)
    assert first == again  # one per user, kept
    as_root = sandbox.execute(["sh", "-c", PARENT_UID], user="root", timeout=20)
    assert as_root.stdout.strip() == "0"  # root's commands: the executor itself, as before


def test_commands_behave_as_before(sandbox: Runtime) -> None:
    done = sandbox.execute(["sh", "-c", "id -u; echo out; echo err >&2; exit 3"], timeout=20)
    assert (done.exit_code, done.stdout, done.stderr) == (3, "1000\nout\n", "err\n")
    assert sandbox.execute(["cat"], stdin="fed", timeout=20).stdout == "fed"
    assert sandbox.execute(["pwd"], cwd="/tmp", timeout=20).stdout == "/tmp\n"
    missing = sandbox.execute(["no-such-command"], timeout=20)
    assert missing.exit_code == 127 and "not found" in missing.stderr
    sandbox.execute("printf '#!/bin/sh\\n' > /tmp/noexec; chmod 644 /tmp/noexec", timeout=20)
    assert sandbox.execute(["/tmp/noexec"], timeout=20).exit_code == 126
    piped = sandbox.execute(["sh", "-c", "yes | head -n 1"], timeout=20)
    assert (piped.exit_code, piped.stdout, piped.stderr) == (0, "y\n", "")
    start = time.monotonic()
    slow = sandbox.execute(["sh", "-c", "sleep 30 & sleep 30; echo never"], timeout=1)
    assert slow.timed_out and "never" not in slow.stdout and time.monotonic() - start < 10
    left = sandbox.execute(["sh", "-c", "pgrep -x sleep || true"], timeout=20)
    assert left.stdout.strip() == "", left  # the timeout took the whole tree


def test_many_at_once(sandbox: Runtime) -> None:
    def one(i: int) -> tuple[int, str]:
        done = sandbox.execute(["sh", "-c", f"echo {i}; echo e{i} >&2; exit {i % 5}"], timeout=60)
        assert done.stderr == f"e{i}\n"
        return done.exit_code, done.stdout

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(48)))
    assert got == [(i % 5, f"{i}\n") for i in range(48)]


def test_the_sandbox_cannot_trace_its_spawner(sandbox: Runtime) -> None:
    pid = spawner_pid(sandbox)
    tried = sandbox.execute(["python3", "-c", TRACE, str(pid)], timeout=30)
    assert tried.exit_code == 0, tried
    attach, mem = tried.stdout.splitlines()
    assert attach.startswith("-1") and mem != "mem read", tried.stdout


def test_a_killed_spawner_costs_its_command_only(sandbox: Runtime) -> None:
    killed = sandbox.execute(["sh", "-c", "kill -9 $PPID; sleep 2; echo survived"], timeout=30)
    assert killed.exit_code == 137 and "survived" not in killed.stdout, killed
    # It may kill the spawner before the spawner named it: then it is reported killed, and
    # never started a second time (a second start, by the root executor, could not kill)
    assert "not permitted" not in killed.stderr, killed
    assert killed.stderr == "" or "spawner was killed" in killed.stderr, killed
    again = sandbox.execute(["echo", "next"], timeout=30)
    assert again.exit_code == 0 and again.stdout == "next\n"


def test_a_stopped_spawner_is_continued(sandbox: Runtime) -> None:
    stopped = sandbox.execute(["sh", "-c", "kill -STOP $PPID; echo stopped"], timeout=30)
    assert stopped.stdout == "stopped\n", stopped
    start = time.monotonic()
    again = sandbox.execute(["echo", "next"], timeout=30)
    assert again.stdout == "next\n" and time.monotonic() - start < 10


def test_a_spawner_is_the_executor_forked(sandbox: Runtime) -> None:
    pid = spawner_pid(sandbox)
    listed = sandbox.execute(
        ["sh", "-c", f"cat /proc/{pid}/cmdline | tr '\\0' ' '"], timeout=20
    ).stdout
    assert "agent.py" in listed  # a fork of the executor: no program of the image's runs


THIEF = (
    "import os, sys, threading, time\n"
    "pid = sys.argv[1]\n"
    "def steal(fd):\n"
    "    while True:\n"
    "        try:\n"
    "            os.read(fd, 4096)\n"
    "        except OSError:\n"
    "            time.sleep(0.01)\n"
    "fds = []\n"
    "for name in os.listdir('/proc/%s/fd' % pid):\n"
    "    try:\n"
    "        fds.append(os.open('/proc/%s/fd/%s' % (pid, name), os.O_RDONLY | os.O_NONBLOCK))\n"
    "    except OSError:\n"
    "        pass\n"
    "for fd in fds:\n"
    "    for _ in range(3):\n"
    "        threading.Thread(target=steal, args=(fd,), daemon=True).start()\n"
    "print(len(fds), flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_thief_of_the_spawners_wakeups_delays_nothing(sandbox: Runtime) -> None:
    """Under gVisor a process of the user may open the spawner's descriptors through /proc
    and read its SIGCHLD wakeup pipe empty: exits must be seen anyway, within a timeout."""
    pid = spawner_pid(sandbox)
    sandbox.execute(
        ["sh", "-c", f'nohup python3 -c "$0" {pid} >/tmp/thief.out 2>&1 &', THIEF], timeout=20
    )
    try:
        for i in range(6):
            start = time.monotonic()
            done = sandbox.execute(["sh", "-c", f"sleep 0.3; exit {i}"], timeout=5)
            assert done.exit_code == i and not done.timed_out, done
            assert time.monotonic() - start < 4
    finally:
        sandbox.execute(["sh", "-c", "pkill -f thief.out; pkill -f 'import os, sys' || true"])


def test_sigint_to_the_spawner_never_turns_a_command_into_a_wrong_answer(
    sandbox: Runtime,
) -> None:
    hit = sandbox.execute(["sh", "-c", "kill -INT $PPID; sleep 1; echo after"], timeout=30)
    assert hit.exit_code == 137 and "after" not in hit.stdout, hit
    assert sandbox.execute(["echo", "next"], timeout=30).stdout == "next\n"


def test_a_folder_only_root_may_enter_is_still_a_working_directory(sandbox: Runtime) -> None:
    """As before the spawners: the executor enters the folder as root, then switches."""
    sandbox.execute("mkdir -p /rootonly && chmod 700 /rootonly", user="root", timeout=20)
    done = sandbox.execute(
        ["sh", "-c", "pwd; ls . >/dev/null 2>&1 || echo denied"], cwd="/rootonly", timeout=20
    )
    assert done.exit_code == 0 and done.stdout.split() == ["/rootonly", "denied"], done
