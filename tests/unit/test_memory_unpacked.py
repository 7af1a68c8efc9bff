"""The folders containerd unpacks a checkpoint into to start a container from it, which it
never removes (backends/docker/memory.py `_drop_unpacked`): each restore removes its own,
found by its marker, and nothing else, whoever else writes in the temporary folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator import procutil
from orchestrator.backends.docker import memory
from orchestrator.procutil import process_start

MARK = f"{memory.MARKER}{'ab' * 16}"


def unpacked(where: Path, name: str, *, marked: bool = True) -> Path:
    folder = where / f"{memory.UNPACKED}{name}"
    folder.mkdir(mode=0o700)
    (folder / "checkpoint.img").write_bytes(b"image")
    if marked:
        (folder / MARK).touch()
    return folder


@pytest.fixture
def where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if os.geteuid() != 0:
        pytest.skip("the folders looked into are root's: run as root")
    monkeypatch.setattr(memory, "_containerd_temps", lambda: (str(tmp_path),))
    return tmp_path


def test_only_the_folder_holding_this_restore_s_marker_goes(where: Path) -> None:
    ours = unpacked(where, "1")
    other = unpacked(where, "2", marked=False)
    named = unpacked(where, "x3")  # (not a name containerd draws)
    memory._drop_unpacked(MARK)
    assert not ours.exists() and sorted(os.listdir(other)) == ["checkpoint.img"]
    assert named.exists()


def test_a_link_or_a_folder_of_another_user_is_never_emptied(where: Path, tmp_path: Path) -> None:
    """Another user's folder holding the marker (it cannot be ours: containerd runs as
    root), or a link to a folder holding it (a victim's files beside it), stays whole."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / MARK).touch()
    (victim / "precious").write_text("keep")
    (where / f"{memory.UNPACKED}999").symlink_to(victim)
    theirs = unpacked(where, "777")
    os.chown(theirs, 1000, 1000)
    memory._drop_unpacked(MARK)
    assert (victim / "precious").read_text() == "keep" and (theirs / "checkpoint.img").exists()


def test_every_folder_holding_the_marker_goes(where: Path) -> None:
    """A start tried again unpacks the same image anew: each of its folders goes."""
    folders = [unpacked(where, str(n)) for n in range(3)]
    memory._drop_unpacked(MARK)
    assert not any(f.exists() for f in folders)


def test_the_search_has_a_deadline(where: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A temporary folder anyone can fill with names: the search gives up in time (and the
    restore's outcome stands: nothing is raised)."""
    for n in range(5000):
        (where / f"{memory.UNPACKED}{100000 + n}").touch()
    ours = unpacked(where, "42")
    began = time.monotonic()
    memory._drop_unpacked(MARK)
    assert not ours.exists() and time.monotonic() - began < 5
    ours = unpacked(where, "43")
    monkeypatch.setattr(memory, "UNPACKED_SCAN", 0.0)
    memory._drop_unpacked(MARK)  # (gave up at once)
    assert ours.exists()


def test_a_gone_or_unreadable_temporary_folder_is_no_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(memory, "_containerd_temps", lambda: (str(tmp_path / "gone"),))
    memory._drop_unpacked(MARK)


def test_a_process_named_containerd_counts_only_as_root_and_a_link_is_no_temp_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Anyone may name a process containerd and give it a TMPDIR of their own (a hostile
    review: a nobody's `containerd` named a folder whose link its owner flipped)."""
    if os.geteuid() != 0:
        pytest.skip("a process of another user is started as root")
    monkeypatch.setattr(memory, "_TEMPS", [])  # (asked anew)
    scratch = Path(tempfile.mkdtemp(prefix="orch-test-"))
    try:
        scratch.chmod(0o755)
        fake = scratch / "containerd"
        shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
        fake.chmod(0o755)
        theirs = scratch / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        env = {"TMPDIR": str(theirs), "PATH": "/usr/bin:/bin"}
        proc = subprocess.Popen([str(fake), "30"], user=65534, group=65534, env=env)
        try:
            deadline = time.monotonic() + 10
            while not Path(f"/proc/{proc.pid}/comm").read_text().startswith("containerd"):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert not memory._root_process(f"/proc/{proc.pid}")
            assert str(theirs) not in memory._containerd_temps()
        finally:
            proc.kill()
            proc.wait()
        assert memory._root_process("/proc/self")
        link = scratch / "link"
        link.symlink_to("/tmp")
        assert not memory._roots_own(str(link), sticky=True)
        assert not memory._roots_own(str(theirs), sticky=True)
        assert memory._roots_own("/tmp", sticky=True) and not memory._roots_own("/tmp")
    finally:
        shutil.rmtree(scratch)


def test_a_search_that_never_answers_is_left_behind_in_time(
    where: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder of the temporary folder a file system that never answers is mounted on (a
    user's FUSE mount): the restore goes on after UNPACKED_SCAN, its search left behind."""
    import threading

    release = threading.Event()
    monkeypatch.setattr(memory, "UNPACKED_SCAN", 0.5)
    monkeypatch.setattr(memory, "_search_unpacked", lambda marker: release.wait(30))
    began = time.monotonic()
    try:
        memory._drop_unpacked(MARK)
        assert time.monotonic() - began < 3
    finally:
        release.set()


def left_by(where: Path, name: str, pid: int, start: str, *, ns: str | None = None) -> Path:
    """A folder unpacked for a restore of process `pid` (started at `start`)."""
    folder = unpacked(where, name, marked=False)
    who = f"{ns or memory._pid_namespace()}-{pid}-{start}-{'cd' * 16}"
    (folder / f"{memory.MARKER}{who}").touch()
    return folder


def a_dead_process() -> tuple[int, str]:
    proc = subprocess.Popen(["sleep", "30"])
    start = process_start(proc.pid)
    proc.kill()
    proc.wait()
    assert start.isdigit()
    return proc.pid, start


@pytest.fixture
def stale(monkeypatch: pytest.MonkeyPatch) -> float:
    """Folders are stale after a second here (then waited for)."""
    monkeypatch.setattr(memory, "UNPACKED_STALE", 1.0)
    monkeypatch.setattr(memory, "up_timeout", lambda: 0.0)
    return 1.2


def test_a_folder_a_killed_restore_left_goes_with_a_later_restore(
    where: Path, stale: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore killed during its start never removed its folder (nothing else knew its
    marker): the marker names its process, and a later restore removes the folder once that
    process is gone and the folder has not changed for UNPACKED_STALE."""
    pid, start = a_dead_process()
    dead = left_by(where, "11", pid, start)
    me = os.getpid()
    alive = left_by(where, "12", me, process_start(me))
    reused = left_by(where, "13", me, "1")  # (its pid now another process's: gone)
    elsewhere = left_by(where, "14", pid, start, ns="1")  # (another pid namespace's)
    hidden = left_by(where, "16", 1, "1")  # (a process whose start cannot be read)
    time.sleep(stale)
    recent = left_by(where, "15", pid, start)
    hour_ago = time.time() - 3600
    os.utime(recent, (hour_ago, hour_ago))  # (a time a tar says: its change is now)
    monkeypatch.setattr(procutil, "process_start", lambda p: "" if p == 1 else process_start(p))
    memory._drop_unpacked(MARK)
    assert not dead.exists() and not reused.exists()
    assert alive.exists() and elsewhere.exists() and recent.exists() and hidden.exists()


def test_a_marker_of_the_dead_counts_only_as_a_regular_file_in_a_root_folder(
    where: Path, stale: float
) -> None:
    pid, start = a_dead_process()
    theirs = left_by(where, "21", pid, start)
    os.chown(theirs, 1000, 1000)
    as_folder = unpacked(where, "22", marked=False)
    (as_folder / f"{memory.MARKER}{memory._pid_namespace()}-{pid}-{start}-{'ef' * 16}").mkdir()
    time.sleep(stale)
    memory._drop_unpacked(MARK)
    assert (theirs / "checkpoint.img").exists() and (as_folder / "checkpoint.img").exists()


def test_a_folder_that_cannot_be_read_stops_no_other(
    where: Path, stale: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid, start = a_dead_process()
    first, second = left_by(where, "31", pid, start), left_by(where, "32", pid, start)
    ours = unpacked(where, "33")
    time.sleep(stale)
    judge = memory._left_by_the_dead
    calls: list[int] = []

    def fails_once(fd: int, found: os.stat_result) -> bool:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(5, "Input/output error")  # (a user's FUSE mount, say)
        return judge(fd, found)

    monkeypatch.setattr(memory, "_left_by_the_dead", fails_once)
    memory._drop_unpacked(MARK)
    assert not ours.exists()
    assert len(calls) == 2 and [first.exists(), second.exists()].count(True) == 1


def test_each_restore_s_marker_names_its_process() -> None:
    made = memory._MARKED.fullmatch(memory._marker())
    assert made is not None
    assert made[1] == memory._pid_namespace() and int(made[2]) == os.getpid()
    assert made[3] == process_start(os.getpid())
    assert memory._marker() != memory._marker()
