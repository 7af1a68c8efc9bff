"""Attacks on the FIFOs that carry folders between this machine and a Docker sandbox: another
user of the sandbox writing into a download or reading an upload, a root sandbox feeding a
download forever, a sandbox paused mid-download, and an owner killed mid-upload."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import OrchestratorError, SandboxUnavailable, spawn_runtime
from orchestrator.backends.docker.runtime import ComposeRuntime
from orchestrator.sandbox import files
from orchestrator.sandbox.options import Command
from tests.conftest import main_container, pause_container
from tests.docker.conftest import MakeEnv
from tests.docker.conftest import same_tree as _same
from tests.docker.conftest import within as _within

TREE = "mkdir -p tree/d && for i in $(seq 40); do head -c 50000 /dev/urandom > tree/d/f$i; done"
BOUND = 10.0

# The transfer folder (/.orchestrator-io) has mode 0700: a user other than its owner cannot
# even list it. As root, tell every user the names of the FIFOs in it, so that the attacks
# below still try each FIFO (their mode 0 alone must stop them).
LISTER = r"""
import os, time
while True:
    names = os.listdir("/.orchestrator-io")
    with open("/tmp/fifo-names.new", "w") as fh:
        fh.write("\n".join(names))
    os.chmod("/tmp/fifo-names.new", 0o644)
    os.rename("/tmp/fifo-names.new", "/tmp/fifo-names")
    time.sleep(0.0005)
"""

NAMES = r"""
import os, select, time

def names():
    try:
        return os.listdir("/.orchestrator-io")
    except OSError:
        try:
            with open("/tmp/fifo-names") as fh:
                return fh.read().split()
        except OSError:
            return []
"""

# As uid 1000: open every download FIFO for writing and write into it; record what it saw
# and what it could write.
WRITER = (
    NAMES
    + r"""
seen = set()
while True:
    for n in names():
        if not n.startswith("out-"):
            continue
        if n not in seen:
            seen.add(n)
            open("/tmp/saw-" + n, "w").close()
        try:
            fd = os.open("/.orchestrator-io/" + n, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.write(fd, b"EVIL" * 1024)
            open("/tmp/wrote-" + n, "w").close()
        except OSError:
            pass
        os.close(fd)
    time.sleep(0.0005)
"""
)

# As uid 1000: read every upload FIFO it can open, appending what it gets to /tmp/stolen.
READER = (
    NAMES
    + r"""
seen = set()
while True:
    for n in names():
        if not n.startswith("in-"):
            continue
        if n not in seen:
            seen.add(n)
            open("/tmp/saw-" + n, "w").close()
        try:
            fd = os.open("/.orchestrator-io/" + n, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        with open("/tmp/stolen", "ab") as out:
            end = time.monotonic() + 2
            while time.monotonic() < end:
                select.select([fd], [], [], 0.05)
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    break
                out.write(data)
        os.close(fd)
    time.sleep(0.0005)
"""
)

# As root: open each download FIFO; once the packer (`tar -c`) has come and gone, write
# one byte every 20 ms into it, for as long as anyone reads.
TRICKLE = r"""
import os, time

def packing():
    for p in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % p, "rb") as fh:
                if fh.read().startswith(b"tar\0-c"):
                    return True
        except OSError:
            pass
    return False

done = set()
while True:
    for n in os.listdir("/.orchestrator-io"):
        if not n.startswith("out-") or n in done:
            continue
        done.add(n)
        try:
            fd = os.open("/.orchestrator-io/" + n, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        if os.fork() == 0:
            end = time.monotonic() + 5
            while not packing() and time.monotonic() < end:
                time.sleep(0.001)
            while packing():
                time.sleep(0.001)
            open("/tmp/trickling", "w").close()
            while True:
                try:
                    os.write(fd, b"\0")
                except BlockingIOError:
                    pass
                except OSError:
                    os._exit(0)
                time.sleep(0.02)
        os.close(fd)
    time.sleep(0.0005)
"""


def _fifos(rt: ComposeRuntime) -> list[str]:
    assert rt.project is not None
    return [p.name for p in (rt.project.directory / "io" / "main").iterdir() if p.is_fifo()]


def _in_background(rt: ComposeRuntime, script: str, user: str, name: str = "attack") -> None:
    """Start `script` as `user` in the background, and return once it runs: under load its
    interpreter can start after the calls it is meant to attack are over."""
    ready = f"/tmp/{name}.ready"
    rt.execute(f"rm -f {ready}", check=True)
    rt.write_file(f"/tmp/{name}.py", f"open({ready!r}, 'w').close()\n{script}")
    rt.execute(f"nohup python3 /tmp/{name}.py >/dev/null 2>&1 &", user=user, check=True)
    deadline = time.monotonic() + 60
    while rt.execute(f"test -e {ready}").exit_code != 0:
        assert time.monotonic() < deadline, f"{name} never started"
        time.sleep(0.05)


def _count(rt: ComposeRuntime, prefix: str) -> int:
    return int(rt.execute(f"ls /tmp | grep -c '^{prefix}' || true").stdout.strip() or 0)


def test_another_sandbox_user_cannot_write_into_a_download(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    with spawn_runtime(make_env("", name="fifowrite")) as rt:
        assert isinstance(rt, ComposeRuntime)
        rt.execute(TREE + " && head -c 20000000 /dev/urandom > tree/blob", check=True)
        _in_background(rt, LISTER, "0", "lister")
        _in_background(rt, WRITER, "1000")
        for n in range(5):
            out = tmp_path / f"out{n}"
            _within(30, lambda out=out: rt.download("tree", out))  # type: ignore[misc]
            assert _same(rt, out), "the download is not the folder"
        assert _count(rt, "saw-out-") >= 1, "the attacker never saw a FIFO: nothing was tested"
        assert _count(rt, "wrote-out-") == 0, "a sandbox user wrote into a root download"
        assert _fifos(rt) == []


def test_another_sandbox_user_cannot_read_an_upload(make_env: MakeEnv, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (secret / "key").write_bytes(b"TOP-SECRET " * 800_000)  # more than the FIFO holds
    (secret / "key").chmod(0o600)
    with spawn_runtime(make_env("", name="fiforead")) as rt:
        assert isinstance(rt, ComposeRuntime)
        _in_background(rt, LISTER, "0", "lister")
        _in_background(rt, READER, "1000")
        for n in range(3):
            with contextlib.suppress(OrchestratorError):  # (broken by the thief, on main)
                _within(30, lambda n=n: rt.upload(secret, f"/root/up{n}"))  # type: ignore[misc]
        assert _count(rt, "saw-in-") >= 1, "the attacker never saw a FIFO: nothing was tested"
        stolen = rt.execute("wc -c < /tmp/stolen 2>/dev/null || echo 0").stdout.strip()
        assert stolen == "0", f"a sandbox user read {stolen} bytes of a root-only upload"
        for n in range(3):
            same = rt.execute(f"md5sum < /root/up{n}/key").stdout.split()
            assert same[:1] == [_md5(secret / "key")], "the upload was broken"
        assert _fifos(rt) == []


def _md5(path: Path) -> str:
    import hashlib

    return hashlib.md5(path.read_bytes()).hexdigest()


def test_bytes_trickling_into_a_download_after_its_packer_cannot_hold_it(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """A root process holds the download FIFO open and writes a byte every 20 ms once the
    packer has exited: the download still ends within the bound, whole or refused."""
    with spawn_runtime(make_env("", name="trickle")) as rt:
        assert isinstance(rt, ComposeRuntime)
        rt.execute(TREE, check=True)
        rt.download("tree", tmp_path / "first")  # the FIFO probe, before the attacker runs
        _in_background(rt, TRICKLE, "0")
        for n in range(2):
            out = tmp_path / f"out{n}"
            started = time.monotonic()
            with contextlib.suppress(OrchestratorError):
                _within(BOUND, lambda out=out: rt.download("tree", out))  # type: ignore[misc]
                assert _same(rt, out)
            assert time.monotonic() - started < BOUND
        assert _count(rt, "trickling") == 1, "the attacker never trickled: nothing was tested"


def test_a_sandbox_paused_mid_download_is_unavailable_within_a_bound(
    make_env: MakeEnv,
) -> None:
    with spawn_runtime(make_env("", name="pausedl")) as rt:
        assert isinstance(rt, ComposeRuntime) and rt._main is not None
        rt.execute("mkdir big && head -c 30000000 /dev/urandom > big/blob", check=True)
        cmd = Command(files.download_argv(f"{rt.workdir}/big"), {}, "/", None, None, None)
        chunks = rt._main.run(cmd, bulk=True)
        assert next(chunks)[0] == "stdout"  # under way (the packer waits for us now)
        pause_container(main_container(rt))
        try:
            started = time.monotonic()

            def rest() -> None:
                for _ in chunks:
                    pass

            with pytest.raises(SandboxUnavailable, match="paused"):
                _within(BOUND, rest)
            assert time.monotonic() - started < BOUND
        finally:
            subprocess.run(["docker", "unpause", main_container(rt)], timeout=60, check=False)
            chunks.close()
        assert rt.execute("echo ok", timeout=20).stdout == "ok\n"


# Owner: spawns, then uploads a folder into a sandbox that reads a little and stops.
OWNER = """
import sys
from orchestrator import spawn_runtime
from orchestrator.sandbox import files
files.upload_argv = lambda dest: ["/bin/sh", "-c", "head -c 1000 > /dev/null; sleep 600"]
rt = spawn_runtime(sys.argv[1])
print(rt.info().id, flush=True)
rt.upload(sys.argv[2], "dest")
"""


def _host_tars(folder: Path) -> list[int]:
    """Pids of this machine's tar processes packing `folder` (their argv names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if Path(argv[0].decode()).name == "tar" and str(folder).encode() in argv:
                found.append(int(entry.name))
    return found


@contextlib.contextmanager
def _owner(env: Path, folder: Path) -> Iterator[subprocess.Popen[str]]:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(env), str(folder)], stdout=subprocess.PIPE, text=True
    )
    try:
        yield owner
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.wait()
        assert owner.stdout is not None
        owner.stdout.close()


def test_the_hosts_tar_dies_with_its_owner_mid_upload(make_env: MakeEnv, tmp_path: Path) -> None:
    folder = tmp_path / "upload-owner-death"
    folder.mkdir()
    with open(folder / "big", "wb") as fh:
        fh.truncate(64 << 20)  # more than the FIFO holds; sparse here
    with _owner(make_env("", name="tarowner"), folder) as owner:
        assert owner.stdout is not None
        project = owner.stdout.readline().strip()
        assert project.startswith("orch-"), "the owner did not start"
        deadline = time.monotonic() + 30
        while not _host_tars(folder):
            assert time.monotonic() < deadline, "the upload never started"
            time.sleep(0.05)
        time.sleep(0.5)  # tar has filled the FIFO and waits for the sandbox to read
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
    deadline = time.monotonic() + 20
    left = _host_tars(folder)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = _host_tars(folder)
    for pid in left:  # (ours: its owner was our child) so that a failure leaves nothing
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, "the host's tar outlived its owner"
    _wait_gone(project)


def _wait_gone(project: str) -> None:
    """The guardian removes the dead owner's project: wait for it (the leak check fails a
    module that leaves it)."""
    flt = f"label=org.orchestrator.project={project}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ps = subprocess.run(
            ["docker", "ps", "-aq", "--filter", flt], capture_output=True, text=True, check=False
        )
        if not ps.stdout.strip():
            return
        time.sleep(0.5)
