"""`orchestrator exec` through an environment's own endpoint (orchestrator/endpoint.py and
backends/container/resident.py): the same answers as the full CLI, nothing heavy loaded, the
full CLI's path whenever the endpoint cannot answer; and who else could use it (a uid-1000
sandbox, root in the sandbox without the token, another local user, a flood)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import attach
from orchestrator.backends.container.executor import wire
from orchestrator.endpoint import ENDPOINT, RECORD
from orchestrator.paths import projects_dir
from tests.docker.conftest import MakeEnv, loaded_by, reaches

CLI = [sys.executable, "-m", "orchestrator"]
FULL = [sys.executable, "-c", "from orchestrator.cli import main; main()"]

LIST_SOCKETS = r"""
import os, stat
for top in ("/.orchestrator-io", "/.orchestrator", "/tmp", "/dev/shm", "/workspace"):
    for folder, _, names in os.walk(top):
        for name in names:
            path = os.path.join(folder, name)
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                print(path)
"""

STOP_RESIDENT = r"""
import os, signal
for p in os.listdir("/proc"):
    try:
        args = open("/proc/%s/cmdline" % p, "rb").read()
    except OSError:
        continue
    if b"--resident" in args:
        os.kill(int(p), signal.SIGKILL)
"""


def counting(pattern: str) -> str:
    """A shell line printing how many processes' command lines start with `pattern` (the
    image has no `ps`)."""
    return (
        "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\"; echo; done 2>/dev/null"
        f" | grep -c '^{pattern}' || true"
    )


SESSIONS = r"""
import os
print(" ".join(n for n in os.listdir("/dev/shm/orchestrator-executor") if "-" in n))
"""


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)  # type: ignore[call-overload, no-any-return]


@pytest.fixture
def up(make_env: MakeEnv) -> Iterator[str]:
    """An environment left running by `orchestrator up`, its user uid 1000."""
    done = run([*CLI, "up", str(make_env("user: '1000:1000'\n", name="endpoint"))])
    assert done.returncode == 0, done.stderr
    ident = done.stdout.strip()
    try:
        yield ident
    finally:
        assert run([*CLI, "down", ident]).returncode == 0


def _folder(ident: str) -> Path:
    return projects_dir() / ident


def _in_container(ident: str, script: str, *args: str, user: str = "0") -> str:
    with attach(ident) as rt:
        return rt.execute(["python3", "-c", script, *args], user=user, timeout=30).stdout


def test_the_endpoint_answers_as_the_full_cli_and_loads_nothing_heavy(up: str) -> None:
    folder = _folder(up)
    assert stat.S_IMODE((folder / RECORD).stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / ENDPOINT).stat().st_mode) == 0o600
    for words in (
        ["--", "sh", "-c", "echo out; echo err >&2; id -u; pwd; exit 3"],
        ["echo one word through the shell; exit 5"],
        ["--", "no-such-command"],
        ["--timeout", "1", "--", "sh", "-c", "echo before; sleep 20"],
        ["--timeout=1", "sleep 20"],
    ):
        fast = run([*CLI, "exec", up, *words])
        full = run([*FULL, "exec", up, *words])
        assert (fast.returncode, fast.stdout, fast.stderr) == (
            full.returncode,
            full.stdout,
            full.stderr,
        ), words
    out, loaded = loaded_by("orchestrator.endpoint", "exec", up, "--", "echo", "hi")
    assert out == "hi\n"
    assert not loaded & {"typer", "pydantic", "python_on_whales", "jinja2", "rich"}, loaded
    # nor what costs milliseconds of its thirty (bench/results/cli.md): a plain exec
    assert not loaded & {"typing", "threading", "contextlib", "platformdirs"}, loaded


def test_stdin_with_i_and_a_timeout_that_kills_the_tree(up: str) -> None:
    fed = run([*CLI, "exec", "-i", up, "--", "sh", "-c", "wc -c; cat"], input="x" * 300_000)
    assert fed.returncode == 0 and fed.stdout.strip() == "300000", fed.stderr
    late = run([*CLI, "exec", up, "--timeout", "1", "--", "sh", "-c", "sleep 30 & sleep 30"])
    assert late.returncode == 124 and "timed out after 1s" in late.stderr
    left = run([*CLI, "exec", up, "--", "sh", "-c", counting("sleep 30")])
    assert left.stdout.strip() == "0", left


def test_a_client_killed_takes_its_command_with_it(up: str) -> None:
    client = subprocess.Popen(
        [*CLI, "exec", up, "--", "sh", "-c", "echo started; sleep 40 & sleep 40"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdout is not None and client.stdout.readline() == "started\n"
    client.send_signal(signal.SIGKILL)
    client.wait(30)
    client.stdout.close()
    deadline = time.monotonic() + 10
    while True:
        left = run([*CLI, "exec", up, "--", "sh", "-c", counting("sleep 40")])
        if left.stdout.strip() == "0":
            break
        assert time.monotonic() < deadline, "the command outlived its client"
        time.sleep(0.2)


def test_without_its_resident_or_paused_exec_takes_the_full_cli(up: str) -> None:
    _in_container(up, STOP_RESIDENT)
    again = run([*CLI, "exec", up, "--", "sh", "-c", "echo still; exit 4"])
    assert (again.returncode, again.stdout) == (4, "still\n"), again.stderr
    assert run([*CLI, "pause", up]).returncode == 0
    try:
        started = time.monotonic()
        paused = run([*CLI, "exec", up, "--", "true"])
        full = run([*FULL, "exec", up, "--", "true"])
        assert (paused.returncode, paused.stderr) == (full.returncode, full.stderr)
        assert paused.returncode != 0 and time.monotonic() - started < 60
    finally:
        assert run([*CLI, "resume", up]).returncode == 0


def test_nobody_without_the_token_runs_anything(up: str) -> None:
    # no process of the sandbox, root included, finds a socket to reach: it is in a folder
    # no container sees, the resident holds it by descriptor
    listed = _in_container(up, LIST_SOCKETS)
    assert listed.strip() == "", listed
    # a connection without the token (here the owner's own, knowing the path): closed
    forged = socket.socket(socket.AF_UNIX)
    os.chdir(_folder(up))
    try:
        forged.connect(ENDPOINT)
        forged.sendall(b"\0" * 32)
        body = json.dumps(
            {"argv": ["touch", "/tmp/forged"], "env": {}, "cwd": "/", "user": None,
             "timeout": None, "stdin": False}
        ).encode()  # fmt: skip
        with contextlib.suppress(OSError):
            forged.sendall(wire.pack(wire.RUN, 1, body))
        forged.settimeout(5)
        with contextlib.suppress(ConnectionResetError):
            assert forged.recv(100) == b""
    finally:
        os.chdir("/")
        forged.close()
    assert run([*CLI, "exec", up, "--", "test", "-e", "/tmp/forged"]).returncode == 1
    # a token trickled a byte at a time is let go within TOKEN_WITHIN (2 s) in all
    os.chdir(_folder(up))
    held: list[socket.socket] = []
    try:
        trickle = socket.socket(socket.AF_UNIX)
        held.append(trickle)
        trickle.connect(ENDPOINT)
        started, closed = time.monotonic(), False
        while time.monotonic() - started < 10 and not closed:
            try:
                trickle.sendall(b"\0")
                closed = select.select([trickle], [], [], 0.4)[0] != [] and not trickle.recv(1)
            except OSError:
                closed = True
        assert closed and time.monotonic() - started < 4
        # a flood of silent connections: a real client is still answered (or the full CLI)
        for _ in range(60):
            s = socket.socket(socket.AF_UNIX)
            s.connect(ENDPOINT)
            held.append(s)
        ok = run([*CLI, "exec", up, "--", "echo", "served"])
        assert (ok.returncode, ok.stdout) == (0, "served\n"), ok.stderr
    finally:
        os.chdir("/")
        for s in held:
            s.close()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_another_local_user_cannot_reach_the_endpoint(up: str) -> None:
    assert reaches(_folder(up), ENDPOINT, as_nobody=True) == "DENIED"
    assert reaches(_folder(up), ENDPOINT, as_nobody=False) == "CONNECTED"  # it can tell


def test_a_session_leaves_no_record_behind(up: str) -> None:
    for _ in range(5):
        assert run([*CLI, "exec", up, "--", "true"]).returncode == 0
    assert _in_container(up, SESSIONS).strip() == ""


def test_the_resident_takes_a_frame_stream_only_after_the_token(up: str) -> None:
    """A client that shows the token gets an executor's greeting first (READY), as the
    endpoint expects; the token itself is only in the owner's record."""
    record = json.loads((_folder(up) / RECORD).read_text())
    token = bytes.fromhex(record["token"])
    s = socket.socket(socket.AF_UNIX)
    os.chdir(_folder(up))
    try:
        s.connect(ENDPOINT)
        s.sendall(token)
        s.settimeout(5)
        frame = wire.read_frame(s.makefile("rb"))
        assert frame is not None and frame[0] == wire.READY
    finally:
        os.chdir("/")
        s.close()
    with attach(up) as rt:  # nothing of the token in what the sandbox's user can read
        found = rt.execute(
            "grep -rlF -f /dev/stdin /proc/[0-9]*/cmdline /proc/[0-9]*/environ /tmp /dev/shm"
            " /workspace 2>/dev/null | head -1",
            stdin=record["token"] + "\n",
            user="1000:1000",
            timeout=60,
        )
        assert found.stdout == ""
        control = rt.execute(  # the search finds it where it is
            "mkdir -p /tmp/c && cat > /tmp/c/t && grep -rlF -f /tmp/c/t /tmp 2>/dev/null",
            stdin=record["token"] + "\n",
            user="1000:1000",
            timeout=60,
        )
        assert control.stdout.startswith("/tmp/c/t")


def _framed_payload(pieces: int) -> bytes:
    """Input that reads as frames wherever a frame of ours were cut into it: each 64 KiB
    piece carries, where a CREDIT slipped into a STDIN frame would shift the reader, a
    RUN as root of a command that leaves a mark (the hostile review's payload)."""
    req: dict[str, object] = {"argv": ["sh", "-c", "id > /tmp/pwned"], "env": {}, "cwd": "/"}
    req.update(user="0", timeout=None, stdin=False)
    run_frame = wire.pack(wire.RUN, 99, json.dumps(req).encode())
    piece = bytearray(b"A" * 65536)
    piece[100 : 100 + len(run_frame)] = run_frame
    end = 100 + len(run_frame)
    piece[end : end + 9] = wire.HEADER.pack(0, 0, 65536 - end - 9)
    piece[65523:65532] = wire.HEADER.pack(0, 0, 13 + 100)
    return bytes(piece) * pieces


def test_stdin_that_looks_like_frames_stays_stdin(up: str) -> None:
    data = _framed_payload(160)  # 10 MiB, with output (and its credit) flowing meanwhile
    done = subprocess.run(
        [*CLI, "exec", "-i", up, "--", "cat"], input=data, capture_output=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout == data, done.stderr[-500:]
    assert run([*CLI, "exec", up, "--", "test", "-e", "/tmp/pwned"]).returncode == 1


def test_a_client_killed_with_unread_output_takes_its_command_with_it(up: str) -> None:
    client = subprocess.Popen(
        [*CLI, "exec", up, "--", "sh", "-c", "head -c 200000 /dev/zero; sleep 41 & sleep 41"],
        stdout=subprocess.PIPE,  # never read
    )
    time.sleep(3)
    client.send_signal(signal.SIGKILL)
    client.wait(30)
    assert client.stdout is not None
    client.stdout.close()
    count = [*CLI, "exec", up, "--", "sh", "-c", counting("sleep 41")]
    deadline = time.monotonic() + 10
    while run(count).stdout.strip() != "0":
        assert time.monotonic() < deadline, "the command outlived its client"
        time.sleep(0.2)
    assert _in_container(up, SESSIONS).strip() == ""


def test_a_reader_gone_ends_the_command_as_the_full_cli_does(up: str) -> None:
    for argv in ([*CLI, "exec", up, "--", "yes"], [*FULL, "exec", up, "--", "yes"]):
        shell = f"{shlex.join(argv)} | head -1"
        done = subprocess.run(
            ["bash", "-c", f"{shell}; echo ${{PIPESTATUS[0]}}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.stdout.split() == ["y", "1"], (argv, done)


def test_a_timeout_too_large_for_a_clock_is_the_full_clis_answer(up: str) -> None:
    fast = run([*CLI, "exec", up, "--timeout", "1e10", "--", "sh", "-c", "exit 6"])
    full = run([*FULL, "exec", up, "--timeout", "1e10", "--", "sh", "-c", "exit 6"])
    assert (fast.returncode, fast.stderr) == (full.returncode, full.stderr) == (6, "")
