"""`orchestrator exec` through an environment's own endpoint (orchestrator/endpoint.py and
backends/container/resident.py): the same answers as the full CLI, nothing heavy loaded, the
full CLI's path whenever the endpoint cannot answer; and who else could use it (a uid-1000
sandbox, root in the sandbox without the token, another local user, a flood)."""

from __future__ import annotations

import json
import os
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
from tests.docker.conftest import MakeEnv

CLI = [sys.executable, "-m", "orchestrator"]
FULL = [sys.executable, "-c", "from orchestrator.cli import main; main()"]

PROBE = """
import json, sys
sys.argv = ["orchestrator", *json.loads(sys.argv[1])]
from orchestrator.endpoint import main
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})), file=sys.stderr)
sys.exit(code)
"""

CONNECT = r"""
import socket, sys
try:
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print("CONNECTED")
except PermissionError:
    print("DENIED")
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

FLOOD = r"""
import socket, sys, time
held = []
for _ in range(100):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); held.append(s)
print("HELD", flush=True)
time.sleep(4)
"""

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
    assert stat.S_IMODE((folder / "io" / "main").stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "io" / "main" / ENDPOINT).stat().st_mode) == 0o600
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
    done = run([sys.executable, "-c", PROBE, json.dumps(["exec", up, "--", "echo", "hi"])])
    assert done.returncode == 0 and done.stdout == "hi\n", done.stderr
    loaded = set(json.loads(done.stderr.splitlines()[-1]))
    assert not loaded & {"typer", "pydantic", "python_on_whales", "jinja2", "rich"}, loaded


def test_stdin_with_i_and_a_timeout_that_kills_the_tree(up: str) -> None:
    fed = run([*CLI, "exec", "-i", up, "--", "sh", "-c", "wc -c; cat"], input="x" * 300_000)
    assert fed.returncode == 0 and fed.stdout.strip() == "300000", fed.stderr
    late = run([*CLI, "exec", up, "--timeout", "1", "--", "sh", "-c", "sleep 30 & sleep 30"])
    assert late.returncode == 124 and "timed out after 1s" in late.stderr
    left = run([*CLI, "exec", up, "--", "sh", "-c", "ps -eo args | grep -c '^sleep 30' || true"])
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
        left = run([*CLI, "exec", up, "--", "sh", "-c", "ps -eo args | grep -c '^sleep 40'"])
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
    inside = f"/.orchestrator-io/{ENDPOINT}"
    # the sandbox's user (uid 1000) cannot even reach the socket
    assert _in_container(up, CONNECT, inside, user="1000:1000").strip() == "DENIED"
    # root in the sandbox (or anyone who reaches it) without the token: closed, nothing runs
    forged = r"""
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(b"\0" * 32)
req = {"argv": ["touch", "/tmp/forged"], "env": {}, "cwd": "/", "user": None,
       "timeout": None, "stdin": False}
body = json.dumps(req).encode()
try:
    s.sendall(bytes([1]) + (1).to_bytes(4, "big") + len(body).to_bytes(4, "big") + body)
except OSError:
    pass
s.settimeout(5)
try:
    print("ANSWERED" if s.recv(100) else "CLOSED")
except ConnectionResetError:
    print("CLOSED")
"""
    assert _in_container(up, forged, inside).strip() == "CLOSED"
    assert run([*CLI, "exec", up, "--", "test", "-e", "/tmp/forged"]).returncode == 1
    # a flood of silent connections: a real client is still answered (or the full CLI is)
    with attach(up) as rt, rt.start(["python3", "-c", FLOOD, inside], user="0") as proc:
        said = proc.read(timeout=30)
        assert said is not None and said.data == b"HELD\n"
        ok = run([*CLI, "exec", up, "--", "echo", "served"])
        assert (ok.returncode, ok.stdout) == (0, "served\n"), ok.stderr
        proc.kill()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_another_local_user_cannot_reach_the_endpoint(up: str) -> None:
    folder = _folder(up) / "io" / "main"
    probe = (
        "import os, socket, sys\n"
        "try:\n"
        "    os.chdir(sys.argv[1]); socket.socket(socket.AF_UNIX).connect(sys.argv[2])\n"
        "    print('CONNECTED')\n"
        "except PermissionError:\n"
        "    print('DENIED')\n"
    )
    args = [sys.executable, "-I", "-c", probe, str(folder), ENDPOINT]
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    assert run([*nobody, *args]).stdout.strip() == "DENIED"
    assert run(args).stdout.strip() == "CONNECTED"  # the probe can tell


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
    os.chdir(_folder(up) / "io" / "main")
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
