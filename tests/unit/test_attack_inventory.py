"""Attacks on what labels, ids and snapshot names may make us touch (no Docker): a label
naming a folder outside our projects folder, an id of one character, a snapshot name that
climbs out of the snapshots folder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.backends.container.identity import (
    KEPT_FILE,
    LABEL_DIR,
    LABEL_PROJECT,
    claim_folder,
    owner_labels,
)
from orchestrator.backends.container.inventory import ProjectInfo, match_project
from orchestrator.errors import ProjectNotFound, UsageError
from orchestrator.paths import projects_dir
from orchestrator.procutil import process_start
from orchestrator.sandbox.snapshot import Snapshot, snapshots_dir

NAME = "orch-evil-0badf00d"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def info(name: str, folder: str) -> ProjectInfo:
    return ProjectInfo(name, {LABEL_PROJECT: name, LABEL_DIR: folder}, [], [])


# ----- item 1: labels never name a host folder to remove ------------------------------------
def test_a_label_climbing_out_of_the_projects_folder_names_no_folder(state: Path) -> None:
    victim = state.parent / "victim"
    victim.mkdir()
    claim_folder(victim)  # it even looks like a project folder: still not ours
    climbing = f"{state}/projects/../../victim"
    assert info(NAME, climbing).directory is None
    assert info("victim", climbing).directory is None
    assert info(NAME, str(victim)).directory is None


def test_a_link_in_the_projects_folder_is_not_a_project_folder(state: Path) -> None:
    victim = state.parent / "victim"
    victim.mkdir()
    (victim / "owner").write_text("1 1 host\n")
    projects_dir().mkdir(parents=True)
    (projects_dir() / NAME).symlink_to(victim)
    assert info(NAME, str(projects_dir() / NAME)).directory is None


def test_only_a_folder_we_made_for_that_very_project_is_ours(state: Path) -> None:
    folder = projects_dir() / NAME
    folder.mkdir(parents=True)
    assert info(NAME, str(folder)).directory is None  # no owner file: not from claim_folder
    claim_folder(folder)
    assert info(NAME, str(folder)).directory == folder.resolve()
    other = "orch-evil-12345678"
    claim_folder(projects_dir() / other)
    assert info(NAME, str(projects_dir() / other)).directory is None  # another's folder
    claim_folder(projects_dir() / "evil")
    assert info("evil", str(projects_dir() / "evil")).directory is None  # not a name of ours


def test_kept_is_only_looked_at_where_the_label_is_plain(state: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "other-state" / "projects" / NAME
    elsewhere.mkdir(parents=True)
    (elsewhere / KEPT_FILE).touch()
    assert info(NAME, str(elsewhere)).kept  # another state folder's kept project: spared
    assert info(NAME, str(elsewhere)).directory is None  # but never ours to remove
    assert not info(NAME, f"{elsewhere}/../{NAME}").kept


def dead_owner_info(folder: Path) -> ProjectInfo:
    """A network-only project naming `folder` and an owner that cannot be alive."""
    labels = {LABEL_PROJECT: NAME, LABEL_DIR: str(folder)}
    labels |= owner_labels(str(2**22 + 7), "1", socket.gethostname())
    return ProjectInfo(NAME, labels, [], ["net"])


def test_another_state_folders_start_in_progress_is_alive_by_its_owner_file(
    state: Path, tmp_path: Path
) -> None:
    """A reap run from one state folder must not condemn a project another state folder is
    starting, when a label forged on the engine names a dead owner: its folder's owner file
    (this process) is read, only read."""
    elsewhere = tmp_path / "other-state" / "projects" / NAME
    claim_folder(elsewhere)
    assert dead_owner_info(elsewhere).directory is None  # never ours to remove
    assert dead_owner_info(elsewhere).alive
    (elsewhere / "owner").write_text(f"{2**22 + 7} 1 {socket.gethostname()}\n")
    assert not dead_owner_info(elsewhere).alive


@pytest.mark.parametrize("forged_dir", ["none", "elsewhere"])
def test_an_object_listed_first_with_a_forged_owner_and_folder_condemns_nothing(
    state: Path, tmp_path: Path, forged_dir: str
) -> None:
    """Anyone on the engine can add an object wearing a project's name that lists first,
    naming a dead owner and no folder (or another one): the project is still alive by what
    its own objects and folder say, and a kept one is still kept."""
    folder = projects_dir() / NAME
    claim_folder(folder)  # a start in progress: this process, alive
    forged = {LABEL_PROJECT: NAME} | owner_labels(str(2**22 + 7), "1", socket.gethostname())
    if forged_dir == "elsewhere":
        forged[LABEL_DIR] = str(tmp_path / "elsewhere" / NAME)
    ours = {LABEL_PROJECT: NAME, LABEL_DIR: str(folder)}
    ours |= owner_labels(str(2**22 + 7), "1", socket.gethostname())  # its labels' owner died
    project = ProjectInfo(NAME, forged, [], ["forged-net", "our-net"])
    project.saw(forged, container=False)
    project.saw(ours, container=False)
    assert project.directory == folder.resolve()
    assert project.alive  # by the owner file of the folder our network names
    (folder / "owner").write_text(f"{2**22 + 7} 1 {socket.gethostname()}\n")
    assert not project.alive
    (folder / KEPT_FILE).touch()
    assert project.kept


def test_what_another_folder_says_counts_for_nothing_once_ours_is_named(
    state: Path, tmp_path: Path
) -> None:
    """A volume anyone adds may name a folder of theirs holding a `kept` mark or a live
    owner: while the project's objects name our folder, only ours counts (a dead owner's
    project is removed, and its admission freed); without ours, another state folder's is
    read as before."""
    folder = projects_dir() / NAME
    claim_folder(folder)
    dead = owner_labels(str(2**22 + 7), "1", socket.gethostname())
    (folder / "owner").write_text(f"{2**22 + 7} 1 {socket.gethostname()}\n")
    theirs = tmp_path / "theirs" / NAME
    claim_folder(theirs)  # a live owner: this process
    (theirs / KEPT_FILE).touch()
    forged = {LABEL_PROJECT: NAME, LABEL_DIR: str(theirs)} | dead
    ours = {LABEL_PROJECT: NAME, LABEL_DIR: str(folder)} | dead
    project = ProjectInfo(NAME, forged, [], ["net"], ["vol"])
    project.saw(forged, container=False)
    project.saw(ours, container=False)
    assert not project.kept and not project.alive and project.directory == folder.resolve()
    alone = ProjectInfo(NAME, forged, [], [], ["vol"])
    alone.saw(forged, container=False)
    assert alone.kept and alone.alive and alone.directory is None


def test_many_objects_naming_folders_cost_a_bounded_look_and_ours_is_always_seen(
    state: Path,
) -> None:
    """Volumes are cheap to forge: ten thousand naming each another folder must not make
    every listing look at each (quadratic, and each a look at the filesystem), nor push
    the folder our start named out of sight."""
    from orchestrator.backends.container import inventory

    folder = projects_dir() / NAME
    claim_folder(folder)
    project = ProjectInfo(NAME, {LABEL_PROJECT: NAME}, [], [])
    for i in range(10_000):
        project.saw({LABEL_DIR: f"/elsewhere/{i}/{NAME}"}, container=False)
    project.saw({LABEL_DIR: str(folder)}, container=False)
    assert len(project.folders) == inventory.FOLDERS_LOOKED_AT + 1
    assert project.directory == folder.resolve() and project.alive


@pytest.mark.parametrize("kind", ["fifo", "link", "huge", "binary"])
def test_a_labelled_owner_file_that_is_not_a_plain_small_record_is_no_owner(
    state: Path, tmp_path: Path, kind: str
) -> None:
    """A label names the folder, so its owner file may be anything: a FIFO never stalls a
    listing, a link is not followed, and garbage is not an owner."""
    elsewhere = tmp_path / "other-state" / "projects" / NAME
    elsewhere.mkdir(parents=True)
    owner = elsewhere / "owner"
    live = f"{os.getpid()} {process_start(os.getpid())} {socket.gethostname()}\n"
    if kind == "fifo":
        os.mkfifo(owner)
    elif kind == "link":
        (tmp_path / "real").write_text(live)
        owner.symlink_to(tmp_path / "real")
    elif kind == "huge":
        owner.write_text(live + " " * 4096)
    else:
        owner.write_bytes(b"\xff\xfe " * 3)
    done = threading.Event()
    result: list[bool] = []

    def look() -> None:
        result.append(dead_owner_info(elsewhere).alive)
        done.set()

    threading.Thread(target=look, daemon=True).start()
    assert done.wait(5), "reading a labelled owner file waited"
    assert result == [False]


# ----- item 11: a prefix counts only what follows `orch-` -----------------------------------
NAMES = ["orch-zebra-1a2b3c4d", "orch-python-5e6f7a8b"]


@pytest.mark.parametrize("ref", ["orch-z", "orch-", "orch-zebr", "orch-py", "orch-pyth"])
def test_one_character_after_orch_takes_nothing_down(ref: str) -> None:
    with pytest.raises(ProjectNotFound, match="at least 6 characters after 'orch-'"):
        match_project(ref, NAMES)


@pytest.mark.parametrize(
    ("ref", "name"),
    [
        ("orch-zebra", "orch-zebra-1a2b3c4d"),  # the environment's whole name
        ("orch-zebra-1", "orch-zebra-1a2b3c4d"),  # six after the prefix
        ("orch-python", "orch-python-5e6f7a8b"),
        ("5e6f7a8b", "orch-python-5e6f7a8b"),
    ],
)
def test_whole_names_and_long_prefixes_still_match(ref: str, name: str) -> None:
    assert match_project(ref, NAMES) == name


# ----- item 12: `snapshot --rm` stays in the snapshots folder -------------------------------
def plant(where: Path, image: str = "") -> None:
    """A snapshot's two files, as a crafted record would look."""
    record = {"env": "x", "digest": "", "created": "", "size": 1, "image": image}
    where.with_suffix(".json").write_text(json.dumps(record))
    where.with_suffix(".tar").write_bytes(b"x")


@pytest.mark.parametrize("name", ["../../x", "../x", "..", ".", "a/b", "/tmp/x"])
def test_a_name_with_a_path_in_it_is_refused(state: Path, name: str) -> None:
    with pytest.raises(UsageError, match="not a snapshot name"):
        Snapshot.named(name)


def test_a_record_linked_out_of_the_snapshots_folder_is_refused(state: Path) -> None:
    outside = state.parent / "outside"
    plant(outside)
    snapshots_dir().mkdir(parents=True)
    (snapshots_dir() / "linked.json").symlink_to(outside.with_suffix(".json"))
    (snapshots_dir() / "linked.tar").symlink_to(outside.with_suffix(".tar"))
    with pytest.raises(UsageError, match="not a snapshot name"):
        Snapshot.named("linked")
    plant(snapshots_dir() / "fine")
    assert Snapshot.named("fine").name == "fine"


def test_cli_rm_of_a_climbing_name_deletes_nothing_and_exits_2(state: Path) -> None:
    snapshots_dir().mkdir(parents=True)
    victim = state.parent / "x"  # what snapshots/../../x names
    plant(victim)
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "snapshot", "--rm", "../../x"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "not a snapshot name" in r.stderr
    assert victim.with_suffix(".json").exists() and victim.with_suffix(".tar").exists()
