"""Packing a local folder for upload: the host's tar and Python's tarfile give the same
archive content, and a failure while packing is kept for the caller to raise."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from orchestrator import UsageError
from orchestrator.sandbox import hostpack


def _tree(root: Path) -> Path:
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "f.txt").write_text("f\n")
    (root / "x.sh").write_text("#!/bin/sh\n")
    (root / "x.sh").chmod(0o751)
    os.symlink("d/f.txt", root / "link")
    return root


def _members(stream: hostpack.PackStream) -> dict[str, tuple[str, int, str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r:") as tar:
        out = {}
        for m in tar.getmembers():
            name = m.name.removeprefix("./")
            if not name or name == ".":
                continue
            data = tar.extractfile(m).read() if m.isfile() else b""  # type: ignore[union-attr]
            kind = "dir" if m.isdir() else "link" if m.issym() else "file"
            out[name] = (kind, m.mode & 0o7777, m.linkname, data)
        return out


def test_host_tar_and_tarfile_pack_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = _tree(tmp_path / "t")
    by_tar = _members(hostpack.PackStream(tree))
    monkeypatch.setattr("shutil.which", lambda name: None)
    by_python = _members(hostpack.PackStream(tree))
    assert by_tar == by_python
    assert by_tar["link"] == ("link", 0o777, "d/f.txt", b"")
    assert by_tar["x.sh"][:2] == ("file", 0o751) and by_tar["d/f.txt"][3] == b"f\n"


def test_a_file_gone_while_packing_is_kept_as_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = _tree(tmp_path / "t")
    monkeypatch.setattr("shutil.which", lambda name: None)
    stream = hostpack.PackStream(tree)
    (tree / "x.sh").unlink()  # listed, then gone before it is read
    b"".join(stream)
    assert isinstance(stream.error, UsageError) and "x.sh" in str(stream.error)


def test_sockets_are_refused_before_anything_is_sent(tmp_path: Path) -> None:
    import socket

    tree = _tree(tmp_path / "t")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tree / "sock"))
        with pytest.raises(UsageError, match="neither a file"):
            hostpack.PackStream(tree)
