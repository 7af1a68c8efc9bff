"""Attacks of issue 37 on cancellation and on a second process, on a real engine: a cancelled
`aio` download or upload lands nothing after the cancel returns (item 13), and a command
whose call raised SandboxPaused does not run on once another process (the CLI) resumes the
environment (item 14)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import SandboxPaused, aio, load_environment, spawn_runtime
from orchestrator.backends.docker.buildplan import build_tags
from orchestrator.sandbox.base import Runtime
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, in_background
from tests.docker.conftest import MakeEnv, spawn_in_mode

CASES = {"executor": (PYTHON_IMAGE, "auto"), "plain": (BUSYBOX_IMAGE, "plain")}
IN_FLIGHT = 30.0
"""The timeout of a command that the CLI pauses under it: the pause (another process, which
took over 8 s on a machine at load 15) must land before it; plain exec's call ends at it."""
QUIET = 3.0
"""Seconds the test watches, after a cancel returned, for anything landing late."""


@pytest.fixture(params=list(CASES))
def rt(request: pytest.FixtureRequest, make_env: MakeEnv) -> Iterator[Runtime]:
    image, mode = CASES[request.param]
    runtime = spawn_in_mode(mode, make_env("", image=image))
    with runtime:
        yield runtime


async def until(check: Callable[[], object], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


async def cancelled(task: asyncio.Future[Any]) -> None:
    """Cancel `task`, and wait until the cancel has returned."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def below(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_cancelled_download_lands_nothing(rt: Runtime, tmp_path: Path) -> None:
    tree = "mkdir -p tree && for i in $(seq 400); do head -c 500000 /dev/urandom > tree/f$i; done"
    rt.execute(tree, timeout=120, check=True)
    dest = tmp_path / "out"

    def unpacking() -> bool:  # the private folder the archive is unpacked into has files
        return any(p.is_file() for p in dest.glob(".orchestrator-download-*/*"))

    async def main() -> None:
        art = aio.AsyncRuntime(rt)
        task = asyncio.ensure_future(art.download("tree", dest, timeout=120))
        await until(lambda: unpacking() or task.done())
        assert not task.done(), "the download was over before it could be cancelled"
        await cancelled(task)

    asyncio.run(main())
    assert below(dest) == []  # nothing moved in, no private folder left
    time.sleep(QUIET)
    assert below(dest) == []


# A root process of the sandbox stops the upload's `tar` once part of the tree is in (and
# every `tar` after): the upload is held mid-way however fast the machine, then cancelled.
HOLD_UPLOAD = (
    "sh -c 'while [ ! -e up/f050 ]; do :; done; "
    "while :; do for d in /proc/[0-9]*; do [ ${d#/proc/} = $$ ] && continue; "
    "c=; read -r c 2>/dev/null < $d/cmdline; "
    'case $c in *"tar -"[cx]" -"*|tar-[cx]*|*/tar-[cx]*) '
    "kill -STOP ${d#/proc/} && : > /tmp/.held ;; esac; "
    "done; done' </dev/null >/dev/null 2>&1 &"
)


def test_a_cancelled_upload_writes_nothing_more(rt: Runtime, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(300):
        (src / f"f{i:03}").write_bytes(os.urandom(500_000))
    listing = "find up -type f -exec wc -c {} + 2>/dev/null | sort; true"
    rt.execute(HOLD_UPLOAD, user="root", timeout=10, check=True)

    async def main() -> str:
        art = aio.AsyncRuntime(rt)
        task = asyncio.ensure_future(art.upload(src, "up", timeout=120))
        held = "test -e /tmp/.held"
        while (await art.execute(held, user="root", timeout=30)).exit_code != 0:
            assert not task.done(), f"the upload was not held: {task}"
        await cancelled(task)
        return (await art.execute(listing, timeout=30)).stdout

    at_cancel = asyncio.run(main())
    total = at_cancel.split()[-2] if "total" in at_cancel else "0"
    assert int(total) < 300 * 500_000, at_cancel[-200:]  # it was cut short
    time.sleep(QUIET)
    assert rt.execute(listing, timeout=30).stdout == at_cancel


# ----- item 14: pause and resume from another process ----------------------------------------
CLI = [sys.executable, "-m", "orchestrator"]


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def writer_of(fifo: Path, seconds: float = 30) -> int:
    """The FIFO opened for writing once its reader is there (it waits in `read` then)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except (FileNotFoundError, OSError):  # not made yet, or no reader yet (ENXIO)
            assert time.monotonic() < deadline, "the command never read its FIFO"
            time.sleep(0.02)


def test_a_command_failed_as_paused_does_not_run_on_after_a_resume_by_the_cli(
    make_env: MakeEnv, tmp_path: Path, case: str
) -> None:
    """The caller was told its command failed (the sandbox is paused): once the CLI, another
    process, resumes the environment, the command must not go on and act unseen, not even
    for the moment a kill after the thaw would take. What it waits for (a line in a FIFO of
    its workspace, written from this host) comes while it is paused: thawed, it would write
    at once."""
    image, mode = CASES[case]
    runtime = spawn_in_mode(mode, make_env("", image=image), workspace=tmp_path / "ws")
    with runtime as rt:
        ident = rt.info().id
        gated = "mkfifo .gate; read x < .gate; echo late > .late"
        thread, out = in_background(lambda: rt.execute(gated, timeout=IN_FLIGHT))
        gate = writer_of(tmp_path / "ws" / ".gate")
        try:
            paused = cli("pause", ident)
            assert paused.returncode == 0, paused.stderr
            thread.join(60)  # the executor: within ~2 s; plain exec: at the command's deadline
            assert not thread.is_alive() and isinstance(out[0], SandboxPaused), out
            os.write(gate, b"go\n")
        finally:
            os.close(gate)
        resumed = cli("resume", ident)
        assert resumed.returncode == 0, resumed.stderr
        time.sleep(2)
        assert not (tmp_path / "ws" / ".late").exists(), "the command ran on"
        assert rt.execute("echo on", timeout=20).stdout == "on\n"


def test_where_the_engine_cannot_kill_in_a_paused_sandbox_the_cli_resume_does(
    make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kill owed is recorded in the environment's folder, and `orchestrator resume` (the
    other process) runs it right after the thaw, before it returns."""
    from orchestrator.backends.container.executor.plain import Killer

    monkeypatch.setattr(Killer, "frozen", lambda self: False)  # here only: not in the CLI
    runtime = spawn_in_mode("plain", make_env("", image=BUSYBOX_IMAGE), workspace=tmp_path / "ws")
    with runtime as rt:
        ident = rt.info().id
        waits = "mkfifo .gate; read x < .gate; sleep 10; echo late > .late"
        thread, out = in_background(lambda: rt.execute(waits, timeout=IN_FLIGHT))
        gate = writer_of(tmp_path / "ws" / ".gate")
        try:
            assert cli("pause", ident).returncode == 0
            thread.join(60)
            assert not thread.is_alive() and isinstance(out[0], SandboxPaused), out
            folder = rt.lasting_folder()
            assert folder is not None and list((folder / "owed-kills").glob("*.json"))
            os.write(gate, b"go\n")
        finally:
            os.close(gate)
        assert cli("resume", ident).returncode == 0
        assert not list((folder / "owed-kills").glob("*.json"))  # run, and gone
        # seen from the host, not by a command (this process owes the kill too, and would
        # run it before its next command): nothing of it runs once `resume` has returned
        deadline = time.monotonic() + 3  # (a SIGKILLed process takes a moment to go)
        while (alive := _gated(f"{ident}-main-1")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive, f"the command ran on: {alive}"
        assert not (tmp_path / "ws" / ".late").exists(), "the command ran on"


def _gated(container: str) -> list[str]:
    """The live processes of the gated command in `container` (docker top, from the host)."""
    top = subprocess.run(
        ["docker", "top", container, "-o", "pid,stat,args"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()[1:]
    rows = [[*line.split(None, 2), ""] for line in top]
    return [
        args
        for _, stat, args, *_ in rows
        if not stat.startswith("Z") and ("echo late" in args or args.strip() == "sleep 10")
    ]


WRAPPED_SH = (
    "#!/bin/busybox sh\n"
    'case "$*" in *orchestrator-killed*) for r in /scratch /proc/1/root/scratch; do '
    "touch $r/setid && chmod 4755 $r/setid; done;; esac\n"
    'exec /bin/busybox sh "$@"\n'
)
"""An image's /bin/sh that, run to kill (KILL_TREE, whatever the signal), plants a set-id
program."""


def test_nothing_of_the_sandboxs_image_runs_to_kill_a_paused_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of item 14: a command failed as paused was killed by a container of the
    sandbox's own image, run as root, without the environment's seccomp profile, in the
    sandbox's process namespace: an image whose /bin/sh was a wrapper planted a 4755
    root-owned program in a read-write host folder (the sandbox itself is refused that
    chmod), for any host user to run. The kill is done from this host now: no program of
    the image runs for it."""
    project = tmp_path / "proj"
    (project / "scratch").mkdir(parents=True)
    (project / "sh").write_text(WRAPPED_SH)
    (project / "Dockerfile").write_text(
        "FROM orchestrator-test/busybox:1\nCOPY sh /wrapped\n"
        "RUN chmod 755 /wrapped && rm /bin/sh && /bin/busybox cp /wrapped /bin/sh\n"
    )
    (project / "env.yaml").write_text(
        "version: 1\nname: killwrap\nbuild: {context: .}\nuser: root\n"
        "mounts: [{source: ./scratch, target: /scratch}]\n"
    )
    monkeypatch.setenv("ORCHESTRATOR_EXEC_MODE", "plain")
    env = load_environment(project / "env.yaml")
    with spawn_runtime(env, workspace=tmp_path / "ws") as rt:
        ident = rt.info().id
        thread, out = in_background(lambda: rt.execute("sleep 100", timeout=IN_FLIGHT))
        # the command runs before the pause (a fixed pause could end first on a busy
        # machine, and the command then start after the resume)
        deadline = time.monotonic() + 30
        while "sleep 100" not in rt.execute("ps -o args", timeout=20).stdout:
            assert time.monotonic() < deadline, "the command never started"
            assert thread.is_alive(), out
            time.sleep(0.1)
        assert cli("pause", ident).returncode == 0
        thread.join(60)
        assert not thread.is_alive() and isinstance(out[0], SandboxPaused), out
        assert cli("resume", ident).returncode == 0
        assert "sleep 100" not in rt.execute("ps -o args", timeout=20).stdout
    setid = project / "scratch" / "setid"
    assert not setid.exists() or not setid.stat().st_mode & 0o6000
    for tag in build_tags(env):
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
