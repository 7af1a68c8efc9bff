"""Attacks of issue 37 on the file calls, on a real engine (item 11): a FIFO, a device or a
socket in place of the file is refused at once on every exec path (the in-container
executor, plain `docker exec` in an image without python3, gVisor), also when a root
sandbox renames one into place between the helper's look at the path and its open; and
`orchestrator snapshot` (which always passes a timeout) of a large sparse file writes the
archive into its file as it comes, never holding it in memory."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import SandboxPermissionError, SandboxUnsafeArchive, spawn_runtime
from orchestrator.sandbox.base import Runtime
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, bounded
from tests.docker.conftest import MakeEnv, spawn_in_mode

HELD = 30.0
"""The file calls' deadline here: the old helpers waited that long on a FIFO, then raised
SandboxFileTimeout; a refusal comes long before."""
SLACK = 10.0
"""Seconds a refused call may take on a busy machine (a `docker exec` or two)."""
CASES = {
    "executor": (PYTHON_IMAGE, "auto", ""),
    "plain": (BUSYBOX_IMAGE, "plain", ""),
    "gvisor": (PYTHON_IMAGE, "auto", "isolation: gvisor\n"),
    "gvisor-plain": (BUSYBOX_IMAGE, "plain", "isolation: gvisor\n"),
}


def _spawn(request: pytest.FixtureRequest, folder: Path) -> Runtime:
    image, mode, extra = CASES[request.param]
    if extra:
        request.getfixturevalue("gvisor_engine")
    path = folder / f"{request.param}.yaml"
    path.write_text(f"version: 1\nname: t\nimage: {image}\n{extra}")
    return spawn_in_mode(mode, path)


@pytest.fixture(scope="module", params=list(CASES))
def rt(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runtime]:
    """One sandbox of each kind for the tests that make a file and call on it (each makes
    its own anew)."""
    with _spawn(request, tmp_path_factory.mktemp("files")) as runtime:
        yield runtime


@pytest.fixture(params=list(CASES))
def rt_alone(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runtime]:
    """One for a test that leaves a process running in it."""
    with _spawn(request, tmp_path) as runtime:
        yield runtime


def refused(call: object) -> None:
    """`call` raises the "not a regular file" PermissionError, well before HELD."""
    outcome, seconds = bounded(call, HELD + SLACK)  # type: ignore[arg-type]
    assert isinstance(outcome, SandboxPermissionError), outcome
    assert isinstance(outcome, PermissionError) and "not a regular file" in str(outcome)
    assert seconds < HELD, seconds


SPECIAL = {
    "fifo": "mkfifo special",
    "link-to-fifo": "mkfifo real && ln -s real special",
    "device": "ln -s /dev/zero special",
    "null-device": "ln -s /dev/null special",
}


@pytest.mark.parametrize("kind", list(SPECIAL))
def test_a_special_file_is_refused_at_once(rt: Runtime, kind: str) -> None:
    made = f"rm -f special real; {SPECIAL[kind]}"
    rt.execute(f"{made}; cd /tmp && {made}", user="root", timeout=20, check=True)
    refused(lambda: rt.read_file("special", timeout=HELD))
    refused(lambda: rt.write_file("special", "data", timeout=HELD))
    # another user, where it may reach (a root sandbox's workspace is its owner's alone)
    refused(lambda: rt.read_file("/tmp/special", user="1000", timeout=HELD))
    after = rt.execute("echo on", timeout=20)
    assert (after.stdout, after.exit_code) == ("on\n", 0), after


def test_a_socket_is_refused_at_once(rt: Runtime) -> None:
    made = rt.execute(
        "python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")'", timeout=20
    )
    if made.exit_code == 127:
        pytest.skip("no python3 in this image to make a socket with")
    assert made.ok, made.stderr
    refused(lambda: rt.read_file("sock", timeout=HELD))
    refused(lambda: rt.write_file("sock", "data", timeout=HELD))


# A root sandbox renames a FIFO and a regular file into place in turn, as fast as it can, so
# that what a helper looked at is not what it opens (no hard links: gVisor makes none of a
# FIFO); the test starts once the first is in place.
SWAPPER = (
    "sh -c 'while :; do mkfifo .y; mv -f .y target; echo regular > .x; "
    "mv -f .x target; done' </dev/null >/dev/null 2>&1 & "
    "while [ ! -e target ]; do sleep 0.05; done"
)


def test_a_fifo_renamed_into_place_never_holds_a_call(rt_alone: Runtime) -> None:
    rt = rt_alone
    rt.execute(SWAPPER, user="root", timeout=20, check=True)
    outcomes: list[str] = []
    for _ in range(6):
        for call in (
            lambda: rt.read_file("target", timeout=HELD),
            lambda: rt.write_file("target", "regular\n", timeout=HELD),
        ):
            outcome, seconds = bounded(call, HELD + SLACK)
            # the regular file, or a refusal: never the FIFO's wait until the deadline
            assert outcome in ("regular\n", None) or isinstance(outcome, SandboxPermissionError), (
                outcome
            )
            # (held by the FIFO, the call would end at HELD with a timeout, which the
            # outcome above refuses; a loaded machine's plain execs under gVisor, beside
            # the swapping loop, took 18 s in CI)
            assert seconds < HELD, seconds
            outcomes.append(type(outcome).__name__)
    after = rt.execute("echo on", timeout=20)
    assert (after.stdout, after.exit_code) == ("on\n", 0), after
    assert "SandboxPermissionError" in outcomes, outcomes  # the FIFO was met, and refused


# ----- a download's merge into the caller's folder (suspected in issue 37) -------------------
def test_a_download_never_replaces_a_callers_folder_by_a_file(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """The sandbox sends `results` as a file where the caller's destination has a folder of
    that name: refused as an unsafe archive, the caller's folder and files kept."""
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / "results" / "mine.txt").write_text("the caller's")
    with spawn_runtime(make_env("")) as rt:
        rt.execute("mkdir -p d && echo sandbox > d/results && echo x > d/other", check=True)
        with pytest.raises(SandboxUnsafeArchive, match="nothing was written"):
            rt.download("d", out)
    assert sorted(p.name for p in out.iterdir()) == ["results"]
    assert (out / "results" / "mine.txt").read_text() == "the caller's"


# ----- a snapshot's memory ---------------------------------------------------------------
CLI = [sys.executable, "-m", "orchestrator"]
MEASURE = (  # a command run as a child, then the largest resident size of a child (KiB)
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)
SPARSE = 600 << 20
"""Bytes of the sparse file: its archive is that big, and was held whole in memory."""
MEMORY = 256 << 20
"""The most the CLI may hold while it snapshots it (a Python process with the package
loaded takes about a third of that)."""


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "workdir", ["", "workdir: /srv\n"], ids=["workspace-by-host", "packed-in-sandbox"]
)
def test_a_snapshot_of_a_large_sparse_file_is_never_whole_in_memory(
    make_env: MakeEnv, tmp_path: Path, workdir: str
) -> None:
    up = cli("up", str(make_env(workdir)))
    assert up.returncode == 0, up.stderr
    ident = up.stdout.split()[0]
    try:
        made = cli("exec", ident, "--", "truncate", "-s", str(SPARSE), "big")
        assert made.returncode == 0, made.stderr
        out = tmp_path / "snap.tar"
        argv = [*CLI, "snapshot", ident, "-o", str(out), "--timeout", "300"]
        measured = subprocess.run(
            [sys.executable, "-c", MEASURE, *argv], capture_output=True, text=True, timeout=600
        )
        code, peak = measured.stdout.splitlines()[-1].split()
        assert code == "0", measured.stderr
        assert out.stat().st_size > SPARSE
        assert int(peak) * 1024 < MEMORY, f"the CLI held {int(peak) // 1024} MiB"
    finally:
        down = cli("down", ident)
        assert down.returncode == 0, down.stderr
