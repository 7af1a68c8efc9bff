"""Removing a checkpoint's memory image (snapshot.remove_files): never through a link, and
never failing on what a folder of plain files should not hold."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.backends.docker.memory import _roots_own, _short, _told
from orchestrator.sandbox.snapshot import remove_files


def test_a_link_in_place_of_the_folder_goes_and_what_it_names_stays(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    link = tmp_path / "x.memory"
    link.symlink_to(victim)
    remove_files(link)
    assert not link.is_symlink() and (victim / "keep").read_text() == "mine"


def test_files_links_and_fifos_go_a_folder_in_it_stays_and_nothing_raises(tmp_path: Path) -> None:
    folder = tmp_path / "x.memory"
    folder.mkdir()
    (folder / "checkpoint.img").write_bytes(b"x")
    os.mkfifo(folder / "fifo")
    outside = tmp_path / "outside"
    outside.write_text("mine")
    (folder / "link").symlink_to(outside)
    (folder / "sub").mkdir()
    remove_files(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["sub"]
    assert outside.read_text() == "mine"
    remove_files(tmp_path / "absent")  # gone already: fine


def test_a_path_runsc_is_given_is_roots_in_every_part(tmp_path: Path) -> None:
    """(memory._roots_own) Every folder above is root's, no link, and writable by root
    alone, or sticky (as /tmp): no one else can point it elsewhere once checked."""
    good = tmp_path / "state" / "moby"
    good.mkdir(parents=True, mode=0o711)
    assert _roots_own(str(good)) is (os.geteuid() == 0 and _roots_own(str(tmp_path)))
    if not _roots_own(str(good)):
        return  # (the checks below need root's folders)
    link = tmp_path / "l"
    link.symlink_to(good.parent)
    assert not _roots_own(str(link / "moby"))
    os.chown(good.parent, 1000, 1000)
    assert not _roots_own(str(good))
    os.chown(good.parent, 0, 0)
    good.parent.chmod(0o777)  # writable by others, not sticky
    assert not _roots_own(str(good))
    good.parent.chmod(0o1777)  # sticky, as /tmp: a root-owned folder in it stays put
    assert _roots_own(str(good))
    assert not _roots_own("/") and not _roots_own("relative") and not _roots_own("/a/../b")


DUMP = (
    'checkpoint failed: checkpointing container "c0ffee": encoding error at object '
    "gofer.dentry{vfsd:vfs.Dentry{mu:sync.Mutex{}}, refs:atomicbitops.Int64{value:2}, "
    'name:"da\\x1b[2Jsh", inoKey:gofer.inoKey{ino:0x1}, '
    "deleted:atomicbitops.Uint32{_:sync.NoCopy{}, value:0x1}, cached:false}\n"
    "goroutine 27 [running]:\ngvisor.dev/gvisor/pkg/state.safely.func1()\n"
)


def test_what_runsc_said_is_told_in_a_line_without_its_dump_or_stack() -> None:
    """runsc's failure to save prints its whole object dump, then a Go stack trace: the
    error kept the last 4 KiB of the trace. It keeps runsc's first line, the object's type
    and, for a file deleted while in use, its name (the sandbox's to choose: printable)."""
    told = _short(_told(DUMP.encode(), b"tail"))
    assert told == (
        'checkpoint failed: checkpointing container "c0ffee": encoding error at object '
        "gofer.dentry (a file deleted while in use: 'da\\\\x1b[2Jsh')"
    ), told
    assert _told(b"starting\npanic: boom\ngoroutine 1 [running]:\n", b"") == "runsc panicked: boom"
    assert _told(b"other words", b" the end \n") == "the end"
    said = _short("restoring failed: header error: EOF: goroutine 14 [running]: a.b() x.go:1")
    assert said == "restoring failed: header error: EOF"
    assert _short("\x1b[2J" + "y" * 700) == "\\x1b[2J" + "y" * 593 + "..."
