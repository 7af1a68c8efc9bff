"""A snapshot's archive written by the host's tar straight into its file (hostpack), and
read back into a FIFO by the kernel (streams.ArchiveFile): bounds, leftovers, what a hostile
workspace can put in the way, and a reader that stops."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from orchestrator import OutputLimitExceeded, UsageError
from orchestrator.sandbox import files, hostpack, streams


def _tree(root: Path) -> Path:
    (root / "d").mkdir(parents=True)
    for i in range(30):
        (root / "d" / f"f{i}").write_bytes(os.urandom(40_000))
    return root


def _parts(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(hostpack.PART)]


def test_a_folder_packs_straight_into_a_file_with_every_entry(tmp_path: Path) -> None:
    src, out = _tree(tmp_path / "src"), tmp_path / "out"
    out.mkdir()
    made = hostpack.pack_to_file(src, out, 1 << 30)
    assert made is not None and made.parent == out and made.stat().st_mode & 0o077 == 0
    with tarfile.open(made) as tar:
        names = {m.name.removeprefix("./") for m in tar if m.isfile()}
    assert names == {f"d/f{i}" for i in range(30)}


def test_past_the_limit_the_file_goes_and_tar_stops(tmp_path: Path) -> None:
    src, out = _tree(tmp_path / "src"), tmp_path / "out"
    out.mkdir()
    with pytest.raises(OutputLimitExceeded, match="limit of 100000 bytes"):
        hostpack.pack_to_file(src, out, 100_000)
    assert list(out.iterdir()) == []  # no part file left behind


def test_links_fifos_and_devices_of_the_workspace_are_entries_never_read(tmp_path: Path) -> None:
    """A hostile workspace: a link to a host secret and a FIFO nobody writes. Packing stores
    both as what they are (it would hang on the FIFO, or copy the secret, if it read them)."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (tmp_path / "secret").write_text("host secret")
    (src / "answer").symlink_to(tmp_path / "secret")
    os.mkfifo(src / "pipe")
    made = hostpack.pack_to_file(src, out, 1 << 20)
    assert made is not None
    with tarfile.open(made) as tar:
        kinds = {m.name.removeprefix("./"): m for m in tar}
    assert kinds["answer"].issym() and kinds["pipe"].isfifo()
    assert b"host secret" not in made.read_bytes()


def test_a_folder_the_host_cannot_pack_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert hostpack.pack_to_file(tmp_path / "missing", out, 1 << 20) is None
    assert _parts(out) == []


def test_an_archive_file_is_read_from_its_start_each_time(tmp_path: Path) -> None:
    data = os.urandom(3 * streams.CHUNK + 5)
    (tmp_path / "a.tar").write_bytes(data)
    with streams.ArchiveFile(tmp_path / "a.tar") as archive:
        assert b"".join(archive) == data
        assert b"".join(archive) == data  # a second use (a fallback) starts over
        assert all(len(c) <= streams.CHUNK for c in archive)


@pytest.mark.parametrize("kind", ["fifo", "missing", "folder"])
def test_only_a_regular_file_is_read_as_a_snapshot(tmp_path: Path, kind: str) -> None:
    """A snapshot path that is a FIFO (which would block the reader forever), a folder or
    nothing is refused at once, with what to do."""
    path = tmp_path / "snap.tar"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    started = time.monotonic()
    with pytest.raises(UsageError, match="cannot read snapshot"):
        streams.ArchiveFile(path)
    assert time.monotonic() - started < 2


def _feed(tmp_path: Path, size: int) -> tuple[streams.ArchiveFile, int, streams.Feeder]:
    (tmp_path / "a.tar").write_bytes(os.urandom(size))
    archive = streams.ArchiveFile(tmp_path / "a.tar")
    read_end, write_end = os.pipe()
    feeder = archive.pack_into(write_end)
    assert feeder is not None
    os.close(write_end)  # the feeder holds its own copy
    return archive, read_end, feeder


def test_the_kernel_feeds_a_whole_file_into_a_pipe(tmp_path: Path) -> None:
    archive, read_end, feeder = _feed(tmp_path, 5 * streams.CHUNK + 123)
    got = bytearray()
    with os.fdopen(read_end, "rb") as pipe:
        while chunk := pipe.read(1 << 16):
            got += chunk
    feeder.wait()
    assert bytes(got) == (tmp_path / "a.tar").read_bytes() and archive.error is None
    archive.close()


def test_a_reader_that_never_reads_does_not_hold_the_feeder(tmp_path: Path) -> None:
    """The sandbox stops reading (a hostile one, or tar refusing the archive) while the FIFO
    is full: stop() ends the feeder within its bound, and it leaves no descriptor open."""
    archive, read_end, feeder = _feed(tmp_path, 8 * streams.CHUNK)
    ours = {f"pipe:[{os.fstat(read_end).st_ino}]", str(tmp_path / "a.tar")}
    time.sleep(0.3)  # the pipe is full by now; the feeder waits for room
    started = time.monotonic()
    feeder.stop()
    assert time.monotonic() - started < streams.STOP_WAIT
    assert not any(t.name.startswith("FileInto") and t.is_alive() for t in threading.enumerate())
    os.close(read_end)
    archive.close()
    # by what each descriptor is: another thread of this process (a reap in the background)
    # may hold one more or one less of its own meanwhile
    left = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            left.add(os.readlink(f"/proc/self/fd/{fd}"))
    assert not left & ours, left & ours


def test_a_reader_that_goes_away_ends_the_feeder(tmp_path: Path) -> None:
    archive, read_end, feeder = _feed(tmp_path, 8 * streams.CHUNK)
    os.close(read_end)  # EPIPE for the writer
    waiter = threading.Thread(target=feeder.wait, daemon=True)
    waiter.start()
    waiter.join(5)
    assert not waiter.is_alive()
    assert archive.error is None  # the reader's side says why, not the feeder
    archive.close()


@pytest.mark.parametrize("taken", ["free", "link", "file"])
def test_a_reset_empties_the_folder_in_parallel_and_follows_no_link(
    tmp_path: Path, taken: str
) -> None:
    """files.REPLACE moves the old content aside and removes it while tar unpacks. The content
    is hostile: links out of the folder are removed, never followed, and where it took the
    name of the folder the old content would go to (a link out, a file) the reset still
    empties everything, by the slower way."""
    work, outside, src = tmp_path / "w", tmp_path / "outside", tmp_path / "src"
    for folder in (work / "ro" / "deep", outside, src):
        folder.mkdir(parents=True)
    (outside / "keep").write_text("host")
    for name in ("x", ".hidden", "..dots", "ro/deep/f"):
        (work / name).write_text(name)
    (work / "ro").chmod(0o500)
    (work / "out").symlink_to(outside)
    (src / "new").write_text("new")
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(src, arcname=".")
    plant = {
        "free": ":",
        "link": f'ln -s {outside} "$1/.orchestrator-old.$$"',
        "file": 'echo x > "$1/.orchestrator-old.$$"',
    }[taken]
    # `exec` keeps the PID, so the planted name is the one the reset picks
    script = f'{plant}; exec /bin/sh -c "$0" sh "$1"'
    with archive.open("rb") as stdin:
        done = subprocess.run(
            ["/bin/sh", "-c", script, files.REPLACE, str(work)], stdin=stdin, timeout=30
        )
    assert done.returncode == 0
    assert sorted(p.name for p in work.iterdir()) == ["new"]
    assert (outside / "keep").read_text() == "host" and not list(outside.glob(".orch*"))
