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

from orchestrator.backends.docker import memory

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
