"""The executor's socket (executor/direct.py): a Docker sandbox's commands go over a unix socket
in the host folder that container alone sees. Who else could reach that socket (a uid-1000
sandbox, a root sandbox without the token, another local user of this machine), and what is
left of it afterwards."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator import ExecutorLost, spawn_runtime
from orchestrator.backends.container.executor import direct, wire
from orchestrator.backends.container.layout import IO_MOUNT
from orchestrator.backends.docker.runtime import ComposeRuntime
from tests.docker.conftest import MakeEnv, reaches

CONNECT = r"""
import socket, sys, time
path, token, then = sys.argv[1], bytes.fromhex(sys.argv[2]), sys.argv[3].encode()
held = []
try:
    for _ in range(int(sys.argv[4])):  # impostors first: wrong tokens, then silent ones
        s = socket.socket(socket.AF_UNIX); s.connect(path); s.sendall(b"\0" * 32); held.append(s)
        s = socket.socket(socket.AF_UNIX); s.connect(path); held.append(s)
    s = socket.socket(socket.AF_UNIX); s.connect(path); s.sendall(token + then)
    if s.recv(1) == b"\1":  # taken: as the executor, it may now say SWITCHED
        print("CONNECTED", flush=True)
    time.sleep(3)
except PermissionError:
    print("DENIED")
"""


def _folder(rt: ComposeRuntime) -> Path:
    shared = rt._shared
    assert shared is not None
    return shared / "main"


def test_commands_go_over_the_socket_and_nothing_of_it_stays(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("user: '1000:1000'\n")) as rt:
        assert isinstance(rt, ComposeRuntime)
        r = rt.execute("echo out; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
        assert rt._main is not None and rt._main.transport == "socket"
        big = rt.execute("head -c 3000000 /dev/zero | tr '\\0' x")
        assert big.stdout == "x" * 3_000_000
        assert [n for n in os.listdir(_folder(rt)) if n.endswith(".sock")] == []
        # the socket of a live executor is gone from the folder: nothing there to reach
        listed = rt.execute(f"ls -a {IO_MOUNT}", user="root").stdout.split()
        assert not [n for n in listed if n.endswith(".sock")]


def test_a_sandbox_user_cannot_connect_and_root_without_the_token_is_not_taken(
    make_env: MakeEnv,
) -> None:
    with spawn_runtime(make_env("user: '1000:1000'\n")) as rt:
        assert isinstance(rt, ComposeRuntime)
        meeting = direct.Meeting(_folder(rt), IO_MOUNT)
        try:
            # uid 1000 (the sandbox's user): the socket is mode 0, in a folder it cannot enter
            tried = rt.execute(
                ["python3", "-c", CONNECT, meeting.inside, meeting.token.hex(), "u", "0"],
                timeout=20,
            )
            assert tried.stdout.strip() == "DENIED", tried
            # root in the sandbox, knowing the token: its connection is the one taken, past
            # impostors that showed a wrong token or none
            r, w = os.pipe()
            got: list[object] = []
            with os.fdopen(r, "rb", buffering=0) as out:
                t = threading.Thread(target=lambda: got.append(meeting.meet(out)))
                t.start()
                proc = rt.start(
                    ["python3", "-c", CONNECT, meeting.inside, meeting.token.hex(), "hi", "3"],
                    user="root",
                    stdin=False,
                )
                said = proc.read(timeout=20)
                assert said is not None and said.data == b"CONNECTED\n", said
                os.write(w, wire.pack(wire.SWITCHED, 0))
                t.join(10)
                os.close(w)
            [conn] = got
            assert hasattr(conn, "recv") and conn.recv(2) == b"hi"
            conn.close()  # type: ignore[attr-defined]
            proc.kill()
            proc.wait(timeout=20)
        finally:
            meeting.close()
        assert os.listdir(_folder(rt)) == []


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_another_local_user_cannot_reach_an_executor_socket(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("")) as rt:
        assert isinstance(rt, ComposeRuntime)
        meeting = direct.Meeting(_folder(rt), IO_MOUNT)
        try:
            assert reaches(_folder(rt), meeting.name, as_nobody=True) == "DENIED"
            assert reaches(_folder(rt), meeting.name, as_nobody=False) == "CONNECTED"
        finally:
            meeting.close()


FIND_EXECUTOR = r"""
import os, signal, sys, time
pids = []
for p in os.listdir("/proc"):
    try:
        args = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
    except OSError:
        continue
    if any(a.endswith(b"agent.py") for a in args) and b"--resident" not in args:
        pids.append(int(p))
for pid in pids:
    os.kill(pid, signal.SIGSTOP)
time.sleep(2)  # the host's pings go unread meanwhile
for pid in pids:
    os.kill(pid, signal.SIGKILL)
print(len(pids))
"""


def test_an_executor_reset_under_unread_frames_fails_its_calls_and_the_next_one_runs(
    make_env: MakeEnv,
) -> None:
    """Its socket reset with frames of ours unread (a root sandbox stops, then kills it):
    the calls waiting on it hear of it, and the next command gets a new executor."""
    with spawn_runtime(make_env("")) as rt:
        assert isinstance(rt, ComposeRuntime)
        assert rt.execute("true").exit_code == 0 and rt._main is not None
        assert rt._main.transport == "socket"
        errors: list[BaseException] = []

        def waiting() -> None:
            try:
                rt.execute("sleep 60")
            except Exception as exc:
                errors.append(exc)

        t = threading.Thread(target=waiting)
        t.start()
        # the command runs before its executor is stopped (a fixed pause can be too short
        # under load, and the kill then lands before the call is under way)
        running = (
            "for p in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < $p 2>/dev/null "
            "| grep -q '^sleep 6[0]' && echo $p; done; true"
        )
        deadline = time.monotonic() + 30
        while not rt.execute(running, user="root").stdout.strip():
            assert time.monotonic() < deadline, "the command never started"
            assert t.is_alive(), errors
            time.sleep(0.1)
        container = rt.project.main_container if rt.project else ""
        killed = subprocess.run(
            ["docker", "exec", container, "python3", "-c", FIND_EXECUTOR],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert killed.stdout.strip() == "1", killed
        t.join(30)
        assert not t.is_alive() and errors and isinstance(errors[0], ExecutorLost), errors
        assert rt.execute("echo again").stdout == "again\n"


def test_a_process_past_descriptor_1023_still_gets_the_socket(make_env: MakeEnv) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1400:
        pytest.skip(f"this machine allows {hard} descriptors per process, not 1400")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1400), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        started = time.monotonic()
        with spawn_runtime(make_env("")) as rt:
            assert isinstance(rt, ComposeRuntime) and rt._main is not None
            assert rt.execute("echo ok").stdout == "ok\n"
            assert rt._main.transport == "socket"
        assert time.monotonic() - started < 15
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
