"""Removing a checkpoint's memory image (snapshot.remove_files): never through a link, and
never failing on what a folder of plain files should not hold."""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from orchestrator.backends.docker.direct import DirectRun
from orchestrator.backends.docker.memory import _canonical, _roots_own, _Rules, _short, _told
from orchestrator.backends.docker.runtime import _only_mount_at
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


def _tar(tmp_path: Path, *members: tarfile.TarInfo) -> Path:
    path = tmp_path / "ws.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for member in members:
            data = b"x" * member.size if member.isreg() else None
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    return path


def _entry(
    name: str, kind: bytes = tarfile.REGTYPE, link: str = "", **attrs: object
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, 3 if kind == tarfile.REGTYPE else 0
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


def _canon(path: Path, within: float = 60, data_max: int = 1 << 30) -> list[tarfile.TarInfo] | None:
    """What the engine would be sent of the archive at `path` for a sandbox user 1000 and
    the working folder /workspace (None: nothing), its first entry the folder itself."""
    out = io.BytesIO()
    rules = _Rules(time.monotonic() + within, (1000, 1000), 4095 - 12, data_max)
    with open(path, "rb") as record:
        if not _canonical(record, out, rules):
            return None
    assert out.getvalue().startswith(b"./\0")  # (never a name that reads as a signature)
    out.seek(0)
    with tarfile.open(fileobj=out, mode="r:") as tar:
        first, *rest = tar.getmembers()
    assert first.name == "." and first.isdir()
    return rest


def test_the_engine_is_sent_folders_files_links_and_fifos_as_the_sandboxs_tar_makes_them(
    tmp_path: Path,
) -> None:
    members = [
        _entry("./", tarfile.DIRTYPE),
        _entry("./a", tarfile.DIRTYPE, mode=0o755),
        _entry("./a/b", tarfile.DIRTYPE, mode=0o2775),
        _entry("./a/b/file", mode=0o4755, uid=0, gid=0),
        _entry("./mine", mode=0o640, uid=1000, gid=1000),
        _entry("./pipe", tarfile.FIFOTYPE),
        _entry("./far", tarfile.SYMTYPE, "/etc/hostname"),  # resolved in the sandbox only
        _entry("./a/b/up", tarfile.SYMTYPE, "../../pipe"),
        _entry("./again", tarfile.LNKTYPE, "./a/b/file"),
    ]
    members[3].pax_headers = {"SCHILY.xattr.security.capability": "\x01", "uname": "x"}
    got = _canon(_tar(tmp_path, *members))
    assert got is not None
    assert [(m.name, m.type, m.linkname, m.mode, m.uid) for m in got] == [
        ("a", tarfile.DIRTYPE, "", 0o755, 0),
        ("a/b", tarfile.DIRTYPE, "", 0o775, 0),
        ("a/b/file", tarfile.REGTYPE, "", 0o755, 0),  # no setuid
        ("mine", tarfile.REGTYPE, "", 0o640, 1000),
        ("pipe", tarfile.FIFOTYPE, "", 0o644, 0),
        ("far", tarfile.SYMTYPE, "/etc/hostname", 0o644, 0),
        ("a/b/up", tarfile.SYMTYPE, "../../pipe", 0o644, 0),
        ("again", tarfile.LNKTYPE, "a/b/file", 0o644, 0),
    ]
    assert all(not m.pax_headers for m in got)  # no attributes, no owners' names


@pytest.mark.parametrize(
    "members",
    [
        [_entry("./dev", tarfile.CHRTYPE)],
        [_entry("./disk", tarfile.BLKTYPE)],
        [_entry("./x", b"Z")],  # (a kind no tar of ours writes)
        [_entry("./x", tarfile.CONTTYPE)],  # (one the engine refuses midway)
        [_entry("/abs")],
        [_entry("../out")],
        [_entry("./a/../../out")],
        [_entry("./ok")],  # (twice: below)
        [_entry("./up", tarfile.SYMTYPE, "../..")],
        [_entry("./a/up", tarfile.SYMTYPE, "../../x")],
        [_entry("./out", tarfile.SYMTYPE, "/data"), _entry("./out/rootsh", uid=0)],
        [_entry("./root", tarfile.SYMTYPE, "/"), _entry("./root/etc/motd")],
        [_entry("./f"), _entry("./f/x")],
        [_entry("./hard", tarfile.LNKTYPE, "../outside")],
        [_entry("./hard", tarfile.LNKTYPE, "/etc/shadow")],
        [_entry("./hard", tarfile.LNKTYPE, "./later"), _entry("./later")],
        [_entry("./l", tarfile.SYMTYPE, "x"), _entry("./hard", tarfile.LNKTYPE, "./l")],
    ],
    ids=lambda ms: " ".join(f"{m.name}:{m.type.decode()}:{m.linkname}" for m in ms),
)
def test_a_workspace_the_engine_would_unpack_otherwise_is_left_to_the_sandbox(
    tmp_path: Path, members: list[tarfile.TarInfo]
) -> None:
    """A device node (the engine, as root, would make it), a name or a link out of the
    folder, an entry through a link an earlier one made (the engine follows it): nothing
    is sent, and the copy's own tar unpacks its workspace (memory.first_start)."""
    assert _canon(_tar(tmp_path, _entry("./ok"), *members)) is None


def test_an_archive_that_cannot_be_read_is_left_to_the_sandbox(tmp_path: Path) -> None:
    (tmp_path / "ws.tar").write_bytes(b"\xff" * 1024 + b"not a tar" * 100)
    assert _canon(tmp_path / "ws.tar") is None


def test_a_pax_size_the_engine_reads_otherwise_sends_only_what_was_checked(tmp_path: Path) -> None:
    """A pax header whose GNU.sparse.size tarfile takes as the file's size and Go's reader
    does not: tarfile skips a device node's header as data, which the engine would read as
    an entry. The engine gets the tar written anew, which holds only what tarfile saw."""
    hidden = _entry("./null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3)
    block = hidden.tobuf(tarfile.USTAR_FORMAT)
    trick = _entry("./f", size=0)
    trick.pax_headers = {"GNU.sparse.size": str(len(block))}
    path = tmp_path / "ws.tar"
    head = trick.tobuf(tarfile.PAX_FORMAT)
    path.write_bytes(head + block + b"\0" * 1024)
    got = _canon(path)
    assert got is None or all(m.type in (tarfile.REGTYPE, tarfile.DIRTYPE) for m in got)


def test_an_archive_read_past_its_deadline_is_left_to_the_sandbox(tmp_path: Path) -> None:
    assert _canon(_tar(tmp_path, _entry("./a"), _entry("./b")), within=-1) is None


def _pax(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", **pax: str) -> tarfile.TarInfo:
    """An entry whose pax header says more than its own fields (how tar readers differ)."""
    info = _entry(name, kind, link)
    info.pax_headers = dict(pax)
    return info


DIR_A = _entry("./a", tarfile.DIRTYPE)


def _sparse(name: str) -> tarfile.TarInfo:
    info = _entry(name)
    info.pax_headers = {"GNU.sparse.size": "3"}
    return info


@pytest.mark.parametrize(
    "members",
    [
        # a NUL ends Go's names, not Python's: `a` a link to /data, then a/x written through it
        [_pax("./n", tarfile.SYMTYPE, "/data", path="a\0z"), _entry("./a/x")],
        [_pax("./n", path="..\0")],  # Go reads `..`: the workdir's parent
        [_pax("./n", tarfile.DIRTYPE, path="..\0")],
        [_pax("./n", tarfile.SYMTYPE, "x", linkpath="x\0/../..")],
        [_pax("./n", path="a\nb")],  # (a control character: no reader is trusted with it)
        # a folder the archive did not make (an image's link, or one replaced later)
        [_entry("./b/x")],
        [DIR_A, _entry("./a/passwd"), _entry("./a", tarfile.SYMTYPE, "/etc")],
        [
            DIR_A,
            _entry("./a/passwd"),
            _entry("./d", tarfile.SYMTYPE, "/etc"),
            _entry("./h", tarfile.LNKTYPE, "./d/passwd"),
        ],
        [_entry("./root", tarfile.DIRTYPE), _entry(".", tarfile.SYMTYPE, "/")],
        [_sparse("./s")],  # sparse: its size is read otherwise
        [_pax("./t", mtime="1e400")],
        [_pax("./t", mtime="-5")],
        [_pax("./u", uid=str(1 << 32))],  # (Go's chown would wrap it to root)
        [_pax("./c", comment="x" * (2 << 20))],  # a header of megabytes: never read whole
        [_entry("./" + "d/" * 300 + "f")],
        [_entry("./" + "n" * 256)],
        [_entry("./" + "/".join(["n" * 250] * 17))],  # (past PATH_MAX below /workspace)
        [_entry("./theirs", uid=4242)],  # another's: the sandbox's tar makes none
        [_entry("./theirs", gid=4242)],
    ],
    ids=[
        "nul-link",
        "dotdot-nul-file",
        "dotdot-nul-dir",
        "nul-target",
        "newline",
        "no-folder",
        "folder-replaced",
        "hard-link-through",
        "root-as-link",
        "sparse",
        "time-inf",
        "time-negative",
        "uid-wraps",
        "huge-header",
        "deep",
        "long-part",
        "long-path",
        "other-uid",
        "other-gid",
    ],
)
def test_what_tar_readers_read_otherwise_is_left_to_the_sandbox(
    tmp_path: Path, members: list[tarfile.TarInfo]
) -> None:
    """Each a way the engine's reader (Go's) would make something else of the record than
    Python's does, or write through a link, found by a hostile review: nothing is sent,
    quickly, and nothing raises."""
    began = time.monotonic()
    assert _canon(_tar(tmp_path, _entry("./ok"), *members)) is None
    assert time.monotonic() - began < 5


def test_what_follows_the_last_entry_read_must_be_the_end(tmp_path: Path) -> None:
    """tarfile takes a header it cannot read, past the first, for the end of the archive:
    a workspace cut short there would start in a copy as if whole."""
    whole = _tar(tmp_path, _entry("./ok")).read_bytes()
    (tmp_path / "cut.tar").write_bytes(whole[:1024] + b"\x01" * 512 + whole[1024:])
    assert _canon(tmp_path / "cut.tar") is None
    assert _canon(tmp_path / "ws.tar") is not None


def test_no_more_content_than_the_record_holds_on_disk(tmp_path: Path) -> None:
    """A record with holes (read as zeros) would fill the disk with the copy sent."""
    big = _entry("./big")
    big.size = 4096
    path = _tar(tmp_path, big)
    assert _canon(path, data_max=4096) is not None
    assert _canon(path, data_max=4095) is None


def _run(*mounts: Mapping[str, object], tmpfs: dict[str, str] | None = None) -> DirectRun:
    host = {"Mounts": list(mounts), "Tmpfs": tmpfs or {}}
    return DirectRun("c", {"HostConfig": host}, ())


OWN: dict[str, object] = {"Type": "bind", "Source": "/state/p/workspace", "Target": "/workspace"}


@pytest.mark.parametrize(
    ("run", "alone"),
    [
        (_run(OWN), True),
        (_run(OWN, {"Type": "bind", "Source": "/x", "Target": "/data", "ReadOnly": True}), True),
        # one the engine could write into: a link in the image may lead it below the folder
        (_run(OWN, {"Type": "bind", "Source": "/x", "Target": "/data"}), False),
        (_run(OWN, {"Type": "bind", "Source": "/x", "Target": "//workspace/sub"}), False),
        # a mount of the file's or the caller's at the working folder (it wins) or below it
        (_run({**OWN, "Source": "/home/me/project"}), False),
        (_run(OWN, {"Type": "bind", "Source": "/x", "Target": "/workspace/sub"}), False),
        (_run(OWN, {"Type": "volume", "Source": "v", "Target": "/workspace/"}), False),
        (_run({**OWN, "ReadOnly": True}), False),
        (_run(OWN, tmpfs={"/workspace/tmp": ""}), False),
        (_run(OWN, tmpfs={"/workspace": ""}), False),
        (_run(OWN, {"Type": "bind", "Source": "/x", "Target": "/workspace/../workspace/x"}), False),
        (_run(), False),
    ],
)
def test_the_engine_unpacks_only_into_the_copys_own_folder(run: DirectRun, alone: bool) -> None:
    """Found by a hostile review: a mount at the working folder replaces the workspace's,
    and the engine, as root, would have unpacked into that host folder."""
    assert _only_mount_at(run, "/workspace", Path("/state/p/workspace")) is alone


def test_a_chain_of_name_headers_is_left_to_the_sandbox_and_raises_nothing(tmp_path: Path) -> None:
    """tarfile reads chained long-name headers by recursing: a thousand of them raised
    RecursionError, which failed the copy instead of leaving it to the sandbox."""
    link = tarfile.TarInfo._create_gnu_long_header(  # type: ignore[attr-defined]
        "x" * 200, tarfile.GNUTYPE_LONGNAME, "utf-8", "strict"
    )
    (tmp_path / "ws.tar").write_bytes(link * 1500 + _entry("./f").tobuf() + b"\0" * 4096)
    assert _canon(tmp_path / "ws.tar") is None
