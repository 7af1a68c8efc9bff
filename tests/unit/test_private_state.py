"""Issue 37, item 9 (no engine): the folders the orchestrator writes its state and records in
are its user's alone. One made first by another local user (or a link to a folder of its
choice, or one in a folder others may change) is refused before anything is written in it;
what is made is private whatever the umask (tests/docker/test_attack_permissions.py walks a
whole lifecycle)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import OrchestratorError, load_environment_text, paths, spawn_runtime

LOCAL = load_environment_text("version: 1\nname: priv\nbackend: local\n")
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="another user's folder needs root")


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(path))
    monkeypatch.delenv("ORCHESTRATOR_ADMISSION", raising=False)
    return path


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@ROOT_ONLY
def test_a_state_folder_someone_else_made_is_refused(state: Path) -> None:
    state.mkdir(mode=0o777)
    os.chown(state, 65534, 65534)
    with pytest.raises(OrchestratorError, match=r"not a folder of this user.*uid 65534"):
        spawn_runtime(LOCAL)
    assert os.listdir(state) == []


def test_a_state_folder_that_is_a_link_is_refused(state: Path, tmp_path: Path) -> None:
    (tmp_path / "chosen").mkdir()
    state.symlink_to(tmp_path / "chosen")
    with pytest.raises(OrchestratorError, match=r"not a folder of this user.*a link"):
        spawn_runtime(LOCAL)
    assert os.listdir(tmp_path / "chosen") == []


@ROOT_ONLY
def test_a_records_folder_someone_else_made_is_refused(state: Path) -> None:
    with spawn_runtime(LOCAL) as rt:
        rt.execute("echo s3cret > secret", check=True)
        (state / "snapshots").mkdir(mode=0o777)
        os.chown(state / "snapshots", 65534, 65534)
        with pytest.raises(OrchestratorError, match="snapshots is not a folder of this user"):
            rt.snapshot("mine")
        with pytest.raises(OrchestratorError, match="snapshots is not a folder of this user"):
            rt.snapshot("mine", timeout=60)  # the in-memory packing path too
    assert os.listdir(state / "snapshots") == []


def test_a_state_folder_in_a_folder_others_may_change_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever may rename entries of the folder holding it may put another in its place;
    a sticky folder (as /tmp) lets nobody move what is ours. (The session's own state
    folder is put back after: popping it sent the worker's later tests to the user's.)"""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(shared / "state"))
    with pytest.raises(OrchestratorError, match="which others may write"):
        paths.state_folder()
    assert not (shared / "state").exists()
    os.chmod(shared, 0o1777)
    assert mode(paths.state_folder("admission")) == 0o700


def test_what_is_made_is_private_whatever_the_umask(
    state: Path, tmp_path: Path, loose_umask: None
) -> None:
    folder = paths.state_folder("snapshots")
    assert [mode(p) for p in (state, folder)] == [0o700, 0o700]
    paths.write_file(folder / "a.json", "{}")
    assert mode(folder / "a.json") == 0o600
    deep = paths.make_folders(tmp_path / "out" / "deeper")
    assert mode(deep) == mode(deep.parent) == 0o700
    paths.write_file(deep / "handed", b"x", 0o644)
    assert mode(deep / "handed") == 0o644


def test_a_folder_of_ours_left_open_by_an_older_release_is_narrowed(state: Path) -> None:
    (state / "snapshots").mkdir(parents=True)
    os.chmod(state, 0o755)
    os.chmod(state / "snapshots", 0o755)
    paths.state_folder("snapshots")
    assert mode(state) == mode(state / "snapshots") == 0o700


def test_a_file_is_replaced_never_written_through(state: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    folder = paths.state_folder("snapshots")
    (folder / "a.json").symlink_to(victim)
    paths.write_file(folder / "a.json", "{}")
    assert victim.read_text() == "keep" and not (folder / "a.json").is_symlink()
