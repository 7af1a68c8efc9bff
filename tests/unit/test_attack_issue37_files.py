"""Attacks of issue 37 on the file calls of the local backend (the reference the container
backends are held to): a FIFO, a device or a socket in place of the file (item 11) is refused
at once, also when it is renamed into place between the helper's look at the path and its
open; and a download never replaces a folder of the caller's with an entry of the sandbox's
(the merge into place)."""

from __future__ import annotations

import io
import os
import socket
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import load_environment_text, spawn_runtime
from orchestrator.errors import SandboxPermissionError, SandboxUnsafeArchive
from orchestrator.sandbox import stage
from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.files import OPEN_WAIT
from tests.conftest import bounded

HELD = 30.0
"""The calls' deadline: the old helpers waited that long on a FIFO."""
SLACK = 10.0


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    env = load_environment_text(
        "version: 1\nname: l\nbackend: local\n", source="l.yaml", base_dir=tmp_path
    )
    with spawn_runtime(env) as runtime:
        yield runtime


def refused(call: object) -> None:
    outcome, seconds = bounded(call, HELD + SLACK)  # type: ignore[arg-type]
    assert isinstance(outcome, SandboxPermissionError), outcome
    assert "not a regular file" in str(outcome)
    assert seconds < HELD, seconds


@pytest.mark.parametrize("kind", ["fifo", "link-to-fifo", "device", "socket"])
def test_a_special_file_is_refused_at_once(rt: Runtime, kind: str, tmp_path: Path) -> None:
    path = Path(rt.workdir, "special")
    held: list[socket.socket] = []
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "real")
        path.symlink_to(tmp_path / "real")
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        held.append(socket.socket(socket.AF_UNIX))
        held[0].bind(str(path))
    try:
        refused(lambda: rt.read_file("special", timeout=HELD))
        refused(lambda: rt.write_file("special", "data", timeout=HELD))
    finally:
        for sock in held:
            sock.close()


def test_a_fifo_renamed_into_place_never_holds_a_call(rt: Runtime) -> None:
    """A FIFO and a regular file renamed over the path in turn: each call gets the file, or a
    refusal within OPEN_WAIT, never the FIFO's wait until the deadline."""
    work = Path(rt.workdir)
    (work / "target").write_text("regular\n")  # there from the first call on: a rename
    stop = threading.Event()  # over it is atomic, so the path is never missing

    def swap() -> None:
        while not stop.is_set():
            os.mkfifo(work / ".y")
            os.replace(work / ".y", work / "target")
            (work / ".x").write_text("regular\n")
            os.replace(work / ".x", work / "target")

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    seen: set[str] = set()
    try:
        for _ in range(10):
            for call in (
                lambda: rt.read_file("target", timeout=HELD),
                lambda: rt.write_file("target", "regular\n", timeout=HELD),
            ):
                outcome, seconds = bounded(call, HELD + SLACK)
                assert outcome in ("regular\n", None) or isinstance(
                    outcome, SandboxPermissionError
                ), outcome
                assert seconds < OPEN_WAIT + SLACK, seconds
                seen.add(type(outcome).__name__)
    finally:
        stop.set()
        swapper.join(10)
    assert "SandboxPermissionError" in seen, seen


# ----- the merge of a download into the caller's folder --------------------------------------
def _archive(*entries: tuple[str, str]) -> list[bytes]:
    """A tar stream of `(name, "dir" | file content)` entries, as a sandbox sends one."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, what in entries:
            info = tarfile.TarInfo(name)
            if what == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size = len(what)
                tar.addfile(info, io.BytesIO(what.encode()))
    return [buffer.getvalue()]


@pytest.mark.parametrize(
    "entries",
    [
        [("results", "the sandbox's file")],  # a file where the caller has a folder
        [("keep", "dir"), ("keep/results", "x"), ("results", "x")],  # after others
        [("notes.txt", "dir"), ("notes.txt/x", "x")],  # a folder where the caller has a file
    ],
    ids=["file-over-folder", "file-over-folder-later", "folder-over-file"],
)
def test_a_download_never_replaces_the_callers_entry_by_another_kind(
    tmp_path: Path, entries: list[tuple[str, str]]
) -> None:
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / "results" / "mine.txt").write_text("the caller's")
    (out / "notes.txt").write_text("the caller's notes")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(SandboxUnsafeArchive, match="nothing was written"):
        stage.stage(_archive(*entries), out, 1 << 20).commit()
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # no private folder
    assert (out / "results" / "mine.txt").read_text() == "the caller's"
    assert (out / "notes.txt").read_text() == "the caller's notes"


def test_a_download_still_merges_folders_and_replaces_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / "results" / "mine.txt").write_text("the caller's")
    (out / "f").write_text("old")
    got = stage.stage(
        _archive(("results", "dir"), ("results/new.txt", "new"), ("f", "new")), out, 1 << 20
    ).commit()
    assert sorted(got) == ["f", "results", "results/new.txt"]
    assert (out / "results" / "mine.txt").read_text() == "the caller's"
    assert (out / "results" / "new.txt").read_text() == "new"
    assert (out / "f").read_text() == "new"
