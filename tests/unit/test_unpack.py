"""Attacks on the download unpacker: archives a hostile sandbox would write. Nothing may land
outside the destination, whatever the Python release's tarfile filter would have let through."""

from __future__ import annotations

import contextlib
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import OrchestratorError, SandboxUnsafeArchive
from orchestrator.sandbox import stage


class Archive:
    """A tar archive written entry by entry, as a sandbox could write it."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()
        self.tar = tarfile.open(  # noqa: SIM115 (closed by chunks())
            fileobj=self.buffer, mode="w", format=tarfile.PAX_FORMAT
        )

    def entry(self, name: str, kind: bytes = tarfile.REGTYPE, **how: object) -> Archive:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = int(how.get("mode", 0o644))  # type: ignore[call-overload]
        info.linkname = str(how.get("to", ""))
        data = str(how.get("data", "")).encode()
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        self.tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        return self

    def folder(self, name: str, mode: int = 0o755) -> Archive:
        return self.entry(name, tarfile.DIRTYPE, mode=mode)

    def link(self, name: str, to: str) -> Archive:
        return self.entry(name, tarfile.SYMTYPE, to=to)

    def hard(self, name: str, to: str) -> Archive:
        return self.entry(name, tarfile.LNKTYPE, to=to)

    def chunks(self) -> Iterator[bytes]:
        self.tar.close()
        data = self.buffer.getvalue()
        for at in range(0, len(data), 7000):  # arrives in pieces, as from a pipe
            yield data[at : at + 7000]


def _download(archive: Archive, dest: Path) -> list[str]:
    return stage.stage(archive.chunks(), dest, 1 << 30).commit()


def _outside(root: Path, dest: Path) -> list[str]:
    """Everything under `root` that is not under `dest` (nor `dest`'s own parents)."""
    found = []
    for path in root.rglob("*"):
        if path == dest or dest in path.parents or path in dest.parents:
            continue
        found.append(str(path.relative_to(root)))
    return sorted(found)


@pytest.fixture
def room(tmp_path: Path) -> tuple[Path, Path]:
    """A destination with a victim file beside it that no download may touch."""
    (tmp_path / "flag").write_text("secret\n")
    return tmp_path, tmp_path / "out"


def test_a_path_max_symlink_chain_cannot_write_outside(room: tuple[Path, Path]) -> None:
    """CVE-2025-4517's shape: links through folder names so long that resolving the last
    link overflows PATH_MAX; a filter that judges by realpath lets `escape` (the folder
    above the destination) through, and files written through it land outside: on Python
    3.11.7 with the `data` filter alone, `flag` beside the destination is overwritten."""
    root, dest = room
    steps = "abcdefghijklmnop"
    width = (os.pathconf(root, "PC_PATH_MAX") - len(str(dest)) - 1) // (len(steps) + 1)
    arc, path = Archive(), ""
    for step in steps:
        arc.folder(os.path.join(path, "d" * width), mode=0o777)
        arc.link(os.path.join(path, step), "d" * width)
        path = os.path.join(path, "d" * width)
    last = os.path.join(*steps, "l" * 254)
    arc.link(last, os.path.join(*[".."] * len(steps)))
    # `last` leads to the private folder the download unpacks into; two above it is `root`
    arc.link("escape", os.path.join(last, "..", ".."))
    arc.entry("escape/flag", data="overwritten").entry("escape/newfile", data="new")
    with pytest.raises(SandboxUnsafeArchive):
        _download(arc, dest)
    assert (root / "flag").read_text() == "secret\n"
    assert _outside(root, dest) == ["flag"]
    assert not dest.exists() or list(dest.iterdir()) == []


def test_a_link_that_climbs_after_a_name_is_refused(room: tuple[Path, Path]) -> None:
    """`s` -> `../..` stands two deep and stays inside; `t` -> `a/b/s/../..` reads as inside
    when `..` is taken by name, but leaves through `s`."""
    root, dest = room
    arc = Archive().folder("a").folder("a/b").link("a/b/s", "../..")
    arc.link("t", "a/b/s/../..").entry("t/flag", data="overwritten")
    with pytest.raises(SandboxUnsafeArchive, match="may lead out"):
        _download(arc, dest)
    assert (root / "flag").read_text() == "secret\n"
    assert _outside(root, dest) == ["flag"]


@pytest.mark.parametrize(
    ("build", "why"),
    [
        (lambda a: a.entry("/abs", data="x"), "absolute"),
        (lambda a: a.entry("../up", data="x"), "climbs"),
        (lambda a: a.entry("a/../../up", data="x"), "climbs"),
        (lambda a: a.link("l", "/etc/passwd"), "leads out"),
        (lambda a: a.link("l", ".."), "may lead out"),
        (lambda a: a.link("a/b", "../.."), "may lead out"),
        (lambda a: a.link("l", ""), "leads out"),
        (lambda a: a.hard("h", "../flag"), "climbs"),
        (lambda a: a.hard("h", "/etc/passwd"), "absolute"),
        (lambda a: a.entry("dev", tarfile.BLKTYPE), "device"),
        (lambda a: a.entry("chr", tarfile.CHRTYPE), "device"),
        (lambda a: a.entry("fifo", tarfile.FIFOTYPE), "FIFO"),
        (lambda a: a.link("l", "a").folder("a").entry("l/x", data="x"), "link or a file"),
        (lambda a: a.entry("f", data="x").entry("f/x", data="x"), "link or a file"),
        (lambda a: a.folder("d").link("d", "x").entry("d/y", data="y"), "link or a file"),
    ],
)
def test_hostile_entries_refuse_the_whole_archive(
    room: tuple[Path, Path], build: object, why: str
) -> None:
    root, dest = room
    arc = Archive().entry("fine.txt", data="fine")
    build(arc)  # type: ignore[operator]
    with pytest.raises(SandboxUnsafeArchive, match=why):
        _download(arc, dest)
    assert list(dest.iterdir()) == []  # not even the private folder is left
    assert _outside(root, dest) == ["flag"]


def test_no_setuid_bit_and_no_write_for_others_comes_out(tmp_path: Path) -> None:
    arc = Archive().entry("suid", data="#!/bin/sh\n", mode=0o6777).entry("ro", data="r", mode=0)
    arc.folder("sticky", mode=0o1777)
    _download(arc, tmp_path)
    assert stat.S_IMODE((tmp_path / "suid").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "ro").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "sticky").stat().st_mode) == 0o755


def test_links_inside_and_hard_links_come_out_as_they_were(tmp_path: Path) -> None:
    arc = Archive().folder("a").folder("a/b").entry("a/b/f", data="data")
    arc.link("top", "a/b/f").link("a/b/up", "../../a").link("a/here", "./b/f")
    arc.hard("a/hard", "a/b/f")
    names = _download(arc, tmp_path)
    assert sorted(names) == ["a", "a/b", "a/b/f", "a/b/up", "a/hard", "a/here", "top"]
    assert (tmp_path / "top").read_text() == "data"
    assert os.readlink(tmp_path / "a" / "b" / "up") == "../../a"
    assert (tmp_path / "a" / "hard").stat().st_ino == (tmp_path / "a" / "b" / "f").stat().st_ino


def test_names_are_relative_to_the_destination(tmp_path: Path) -> None:
    """`download()` hands back names a caller joins to the destination: never absolute."""
    arc = Archive().folder(".").folder("./x").entry("./x/y", data="y").entry("z//w", data="w")
    names = _download(arc, tmp_path)
    assert sorted(names) == ["x", "x/y", "z/w"]
    assert all((tmp_path / n).exists() for n in names)


_NAMES = st.sampled_from(["a", "b", "a/b", "a/b/c", "b/a", "c"])
_TARGETS = st.lists(st.sampled_from(["..", ".", "a", "b", "c", ""]), min_size=1, max_size=5)
_ENTRIES = st.lists(
    st.one_of(
        st.tuples(st.just("dir"), _NAMES, st.just("")),
        st.tuples(st.just("file"), _NAMES, st.just("")),
        st.tuples(st.just("link"), _NAMES, _TARGETS.map("/".join)),
        st.tuples(st.just("hard"), _NAMES, _NAMES),
    ),
    max_size=12,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(entries=_ENTRIES)
def test_no_archive_of_links_reaches_outside(
    tmp_path: Path, entries: list[tuple[str, str, str]]
) -> None:
    """Any mix of folders, files, links and hard links, in any order: either it is refused
    or every link in the result resolves inside the destination, and nothing outside changed."""
    case = Path(os.path.realpath(tmp_path)) / os.urandom(6).hex()
    dest = case / "o" / "p"
    dest.mkdir(parents=True)
    (case / "flag").write_text("secret\n")
    arc = Archive()
    for kind, name, to in entries:
        if kind == "dir":
            arc.folder(name)
        elif kind == "file":
            arc.entry(name, data="x")
        elif kind == "link":
            arc.link(name, to)
        else:
            arc.hard(name, to)
    arc.entry("a/b/c/d/flag", data="overwritten")  # a last write through whatever links exist
    with contextlib.suppress(OrchestratorError):  # refused, or a hard link to nothing
        _download(arc, dest)
    assert (case / "flag").read_text() == "secret\n"
    assert _outside(case, dest) == ["flag"]
    for path in dest.rglob("*"):
        if path.is_symlink():
            try:
                resolved = path.resolve(strict=True)
            except RuntimeError:
                continue  # a loop: it leads nowhere
            except FileNotFoundError:  # a link to nothing yet: where would it be made?
                resolved = Path(os.path.realpath(path))
            except OSError:  # ELOOP from the kernel: a loop too
                continue
            assert resolved == dest or dest in resolved.parents, f"{path} -> {resolved}"


def test_a_hard_link_cannot_carry_a_link_to_a_shallower_place(room: tuple[Path, Path]) -> None:
    """`a/s` -> `..` stays inside; the same link hard-linked as `h` would point above."""
    _, dest = room
    with pytest.raises(SandboxUnsafeArchive, match="may lead out"):
        _download(Archive().folder("a").link("a/s", "..").hard("h", "a/s"), dest)
    assert list(dest.iterdir()) == []


def test_a_link_already_in_the_destination_is_replaced_not_followed(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "h").symlink_to(tmp_path)
    assert _download(Archive().folder("h").entry("h/pwned", data="x"), dest) == ["h", "h/pwned"]
    assert not (tmp_path / "pwned").exists() and (dest / "h" / "pwned").read_text() == "x"


def test_deep_names_are_refused_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnsafeArchive, match="deep"):
        _download(Archive().entry("a/" * 2000 + "f", data="x"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_replaced_while_others_are_open_keeps_unpacking(tmp_path: Path) -> None:
    arc = Archive().folder("a").folder("a/b").entry("a/b/f", data="1")
    arc.entry("a", data="now a file").folder("c").entry("c/g", data="2")
    assert sorted(_download(arc, tmp_path)) == ["a", "a", "a/b", "a/b/f", "c", "c/g"]
    assert (tmp_path / "a").read_text() == "now a file" and (tmp_path / "c" / "g").exists()
