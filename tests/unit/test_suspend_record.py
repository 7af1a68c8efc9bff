"""The record of a suspended environment (no engine needed): older records stay readable, a
record is input (a bad one is not usable), names stay in the snapshots folder, and the
owner rule of `suspend(keep=False)`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import Snapshot, UsageError, get_runtime_class, list_snapshots
from orchestrator.sandbox import snapshot
from orchestrator.sandbox.snapshot import snapshots_dir


def _record(name: str, **fields: object) -> Path:
    folder = snapshots_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.tar").write_bytes(b"")
    base = {"env": "e", "digest": "d", "created": "2026-01-01T00:00:00Z", "size": 0}
    (folder / f"{name}.json").write_text(json.dumps({**base, **fields}))
    return folder / f"{name}.tar"


def test_an_older_record_reads_as_a_snapshot_with_no_services() -> None:
    found = Snapshot.find(_record("old-style", image="orchestrator-snapshot:abc"))
    assert found.services == {} and found.owner == {} and not found.suspended
    assert found.images == {"main": "orchestrator-snapshot:abc"}
    found.path.unlink()
    found.record.unlink()


@pytest.mark.parametrize("services", [["x"], {"db": 3}, "db"])
def test_a_record_with_a_malformed_field_is_not_usable(services: object) -> None:
    path = _record("malformed", services=services)
    with pytest.raises(UsageError, match="no snapshot"):
        Snapshot.find(path)
    path.unlink()
    path.with_suffix(".json").unlink()


def test_main_is_never_taken_from_the_services_mapping() -> None:
    snap = Snapshot(Path("/x.tar"), "e", "d", "c", 0, "mine", services={"main": "theirs"})
    assert snap.images["main"] == "mine"


def test_a_suspend_name_is_a_plain_new_name() -> None:
    for bad in ("../escape", "/abs/path", "", ".", "-rf"):
        with pytest.raises(UsageError, match="not a name"):
            snapshot.record_path("env", bad)
    taken = _record("taken")
    with pytest.raises(UsageError, match="already"):
        snapshot.record_path("env", "taken")
    taken.unlink()
    taken.with_suffix(".json").unlink()
    assert snapshot.record_path("env", None).parent == snapshots_dir()


def test_the_record_keeps_the_new_fields() -> None:
    path = snapshots_dir() / "written.tar"
    saved = snapshot.save(
        b"x", "e", "d", path, backend="local", suspended=True, owner={"pid": "1"}, source="/f"
    )
    again = Snapshot.find("written")
    assert again == saved and again.suspended and again.backend == "local"
    assert again.owner == {"pid": "1"} and again.source == "/f"
    saved.remove()


def test_an_owned_record_goes_when_its_owner_is_gone_and_a_kept_one_stays() -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = {"pid": dead.stdout.strip(), "start": "1", "host": socket.gethostname()}
    _record("of-dead", owner=gone, suspended=True)
    _record("of-live", owner=snapshot.this_process(), suspended=True)
    _record("kept-one", suspended=True)
    removed = snapshot.reap_suspended()
    names = {s.name for s in list_snapshots()}
    assert removed == ["of-dead (suspended; its owner is gone)"]
    assert {"of-live", "kept-one"} <= names and "of-dead" not in names
    # the owner's guardian, once it is gone, names it exactly
    assert snapshot.reap_suspended(snapshot.this_process())[0].startswith("of-live")
    Snapshot.find("kept-one").remove()


def test_swarm_and_local_list_their_suspend_deviation() -> None:
    assert "another node" in get_runtime_class("swarm").deviations["suspend"]
    assert "workspace only" in get_runtime_class("local").deviations["suspend-filesystem"]


def test_a_memory_image_a_killed_save_left_goes_with_the_next_reap() -> None:
    """A save killed after it made the memory image and before it wrote its record left the
    image (the sandbox's whole memory) for good: no reap looked at a `.memory` folder with
    no record. Now a save names itself beside its record first, and the reap removes what
    a save no longer running made, never what a running one makes or a record names."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    folder = snapshots_dir()
    folder.mkdir(parents=True, exist_ok=True)

    def memory(name: str) -> Path:
        made = folder / f"{name}{snapshot.MEMORY_SUFFIX}"
        made.mkdir(mode=0o700)
        (made / "checkpoint.img").write_bytes(b"memory")
        return made

    killed, older, running = memory("killed"), memory("older"), memory("running")
    (folder / "killed.tar").write_bytes(b"half")
    (folder / f"killed{snapshot.PENDING_SUFFIX}").write_text(
        f"{dead.stdout.strip()} 1 {socket.gethostname()}\n"
    )
    with snapshot.saving(folder / "running.json"):  # this process saves it now
        whole = _record("whole", owner=snapshot.this_process(), suspended=True)
        kept = memory("whole")
        snapshot.reap_suspended()
        assert not killed.exists() and not (folder / "killed.tar").exists()
        assert not (folder / f"killed{snapshot.PENDING_SUFFIX}").exists()
        assert not older.exists()  # (no record, no save running)
        assert running.exists() and kept.exists() and whole.exists()
    snapshot.remove_files(running)
    Snapshot.find("whole").remove()
    assert not kept.exists()


def test_a_name_is_held_by_its_save_alone_until_the_kernel_lets_it_go(tmp_path: Path) -> None:
    """One save of a name at a time, by a lock the kernel holds for the saving process: a
    second is refused and removes nothing, a reap leaves what the save made, and a save
    SIGKILLed midway lets the name go (its memory image goes with the next reap, and the
    name can be saved again). Before, the owner was a file naming a process, which a second
    save (or a reap) could judge dead and move aside while the first still saved."""
    folder = snapshots_dir()
    folder.mkdir(parents=True, exist_ok=True)
    script = (
        "import os, sys, time; from pathlib import Path; "
        "from orchestrator.sandbox import snapshot; "
        "record = Path(sys.argv[1]); "
        "cm = snapshot.saving(record); cm.__enter__(); "
        "m = record.with_suffix(snapshot.MEMORY_SUFFIX); m.mkdir(); "
        "(m / 'pages.img').write_bytes(b'memory'); print('saving', flush=True); time.sleep(600)"
    )
    record = folder / "held.v2.json"  # (a dot in the name)
    saver = subprocess.Popen(
        [sys.executable, "-c", script, str(record)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert saver.stdout is not None and saver.stdout.readline() == "saving\n"
        memory = folder / f"held.v2{snapshot.MEMORY_SUFFIX}"
        assert snapshot.being_saved(record)
        with (
            pytest.raises(UsageError, match="being saved by another process"),
            snapshot.saving(record),
        ):
            pass
        snapshot.reap_suspended()
        assert memory.exists() and (folder / f"held.v2{snapshot.PENDING_SUFFIX}").exists()
    finally:
        saver.kill()
        saver.wait(30)
        if saver.stdout is not None:
            saver.stdout.close()
    assert not snapshot.being_saved(record)
    snapshot.reap_suspended()
    assert not memory.exists() and not (folder / f"held.v2{snapshot.PENDING_SUFFIX}").exists()
    with snapshot.saving(record):  # (free again)
        assert snapshot.being_saved(record)
    assert not snapshot.being_saved(record)


def test_a_name_is_found_in_the_snapshots_folder_whatever_the_current_folder_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`v1.2` was taken for a path: a folder of that name in the current folder made a
    record there (`v1.json`, whatever it said) the one found, and woken."""
    saved = snapshot.save(b"x", "e", "d", snapshot.record_path("e", "v1.2"), backend="local")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "v1.2").mkdir()
    (tmp_path / "v1.json").write_text(
        json.dumps({"env": "forged", "digest": "", "created": "", "size": 0})
    )
    assert Snapshot.find("v1.2") == saved and saved.path.parent == snapshots_dir()
    saved.remove()


FORKS_WHILE_SAVING = """
import os, sys, time
from pathlib import Path
from orchestrator.sandbox import snapshot
record = Path(sys.argv[1])
with snapshot.saving(record):
    leaver = os.fork()
    if leaver == 0:  # a child that leaves the block as the saver would: removes nothing
        sys.exit(0)
    os.waitpid(leaver, 0)
    print("kept" if snapshot.being_saved(record) else "lost", flush=True)
    if os.fork() == 0:  # a child that outlives the saver: holds no lock
        time.sleep(60)
        os._exit(0)
    print("saving", flush=True)
    time.sleep(600)
"""


def test_a_child_forked_during_a_save_neither_holds_nor_removes_its_name() -> None:
    """A child forked while a save ran kept the lock open after the saver died (the name
    refused, its memory image never reaped, for the child's life); one that left the block
    removed the saver's file, and a second save of the name went ahead."""
    folder = snapshots_dir()
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / "forking.json"
    saver = subprocess.Popen(
        [sys.executable, "-c", FORKS_WHILE_SAVING, str(record)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert saver.stdout is not None
        assert saver.stdout.readline() == "kept\n"
        assert saver.stdout.readline() == "saving\n"
        assert snapshot.being_saved(record)
        saver.kill()  # (the child sleeps on)
        saver.wait(30)
        # the child lets go of the lock as it first runs after its fork, which a loaded
        # machine may not have given it yet (CI, once): within a bound, never for its life
        deadline = time.monotonic() + 10
        while snapshot.being_saved(record):
            assert time.monotonic() < deadline, "the sleeping child still holds the name"
            time.sleep(0.05)
        with snapshot.saving(record):
            pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(saver.pid, signal.SIGKILL)
        if saver.stdout is not None:
            saver.stdout.close()
        # (nothing of it for the next test of this worker's state folder)
        record.with_suffix(snapshot.PENDING_SUFFIX).unlink(missing_ok=True)


def test_a_plain_name_is_never_a_record_of_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain name with no snapshot of its own fell back to a file of that name in the
    current folder: a repository's forged `prod.json` (any image, any memory folder) was
    woken by `wake("prod")`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prod").write_bytes(b"")
    forged = {"env": "e", "digest": "", "created": "", "size": 0, "image": "evil/img:latest"}
    (tmp_path / "prod.json").write_text(json.dumps(forged))
    with pytest.raises(UsageError, match="no snapshot 'prod'"):
        Snapshot.find("prod")


def test_a_reap_locks_no_whole_record_and_still_takes_a_stale_claim_beside_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every `ps`, `up` and guardian reaps: taking each whole record's name made and removed
    a `.pending` file per record each time. A name whose record is whole and that no save
    claims is left alone now; a claim a killed save left beside a record is still taken."""
    folder = snapshots_dir()
    folder.mkdir(parents=True, exist_ok=True)
    _record("whole-a", suspended=True)
    _record("whole-b", suspended=True)
    _record("claimed", suspended=True)
    stale = folder / f"claimed{snapshot.PENDING_SUFFIX}"
    stale.write_text("")  # no process holds it
    held: list[str] = []
    real = snapshot._held

    def counted(pending: Path, **kw: object) -> object:
        held.append(pending.name)
        return real(pending, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshot, "_held", counted)
    snapshot.reap_suspended()
    assert held == [f"claimed{snapshot.PENDING_SUFFIX}"]
    assert not stale.exists()
    for name in ("whole-a", "whole-b", "claimed"):
        assert not (folder / f"{name}{snapshot.PENDING_SUFFIX}").exists()
        Snapshot.find(name).remove()
