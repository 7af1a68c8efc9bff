"""The conformance checks of files: single files (text, bytes, limits, permissions), static
assets, and whole folders moved as tar streams (modes, links, what may land where)."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from pathlib import Path

import pytest

from orchestrator import Runtime
from orchestrator.errors import (
    OrchestratorError,
    OutputLimitExceeded,
    SandboxFileNotFound,
    SandboxUnsafeArchive,
    UsageError,
)
from orchestrator.testing.conformance.kit import MiB, skip_if
from orchestrator.testing.target import Target, stat_argv


# ----- files ---------------------------------------------------------------------------------
def test_file_text_round_trip_keeps_line_endings(rt: Runtime) -> None:
    rt.write_file("f/crlf.txt", "a\r\nb\n\u00e9")
    assert rt.read_file("f/crlf.txt") == "a\r\nb\n\u00e9"
    assert rt.execute("cat f/crlf.txt").stdout == "a\r\nb\n\u00e9"


def test_write_creates_parents_and_read_bytes(rt: Runtime) -> None:
    rt.write_file("deep/er/x.bin", b"\x00\xff\x01")
    assert rt.read_file("deep/er/x.bin", text=False) == b"\x00\xff\x01"


def test_50mib_binary_file_round_trip(rt: Runtime) -> None:
    data = os.urandom(50 * MiB)
    rt.write_file("big.bin", data)
    assert (
        hashlib.sha256(rt.read_file("big.bin", text=False)).digest()
        == hashlib.sha256(data).digest()
    )
    rt.execute("rm big.bin")


def test_read_missing_file(rt: Runtime) -> None:
    with pytest.raises(FileNotFoundError):
        rt.read_file("missing.txt")
    with pytest.raises(SandboxFileNotFound):
        rt.read_file("missing.txt")


def test_read_and_write_a_folder(rt: Runtime) -> None:
    rt.execute("mkdir -p adir")
    with pytest.raises(IsADirectoryError):
        rt.read_file("adir")
    with pytest.raises(IsADirectoryError):
        rt.write_file("adir", "x")


def test_permission_denied(rt: Runtime, conformance_target: Target) -> None:
    skip_if(conformance_target, "user", when=os.geteuid() != 0)
    rt.write_file("secret.txt", "s", user="root")
    rt.execute("chmod 600 secret.txt", user="root")
    with pytest.raises(PermissionError):
        rt.read_file("secret.txt", user="65534:65534")
    rt.execute("mkdir -p locked && chmod 555 locked", user="root")
    with pytest.raises(PermissionError):
        rt.write_file("locked/x.txt", "x", user="65534:65534")


def test_a_download_with_something_unreadable_inside_is_permission_denied(
    rt: Runtime, conformance_target: Target, tmp_path: Path
) -> None:
    """GNU tar exits 2 on a file it cannot open, the helper's code for "no such folder": a
    folder that exists was reported missing."""
    skip_if(conformance_target, "user", when=os.geteuid() != 0)
    name = f"part-{uuid.uuid4().hex[:8]}"
    rt.execute(f"mkdir -p {name}/sub && echo b > {name}/sub/b && chmod 700 {name}/sub", user="root")
    with pytest.raises(PermissionError):
        rt.download(name, tmp_path / "out", user="65534:65534")


def test_file_over_limit(rt: Runtime) -> None:
    rt.write_file("hundred.txt", "x" * 100)
    with pytest.raises(OutputLimitExceeded):
        rt.read_file("hundred.txt", limit=10)
    with pytest.raises(OrchestratorError):
        rt.read_file("hundred.txt", limit=10)


# ----- static assets -------------------------------------------------------------------------
def test_static_placeholders_resolve_in_file_commands_only(rt: Runtime) -> None:
    assert rt.execute("cat .static-copy").stdout == "static hello\n"  # a setup command
    assert rt.execute(rt.file_command("show")).stdout == "static hello\n"
    assert rt.execute(["cat", f"{rt.static_path('data')}/hello.txt"]).stdout == "static hello\n"
    # a caller's text runs as given: model-written text cannot reach paths by placeholder
    r = rt.execute(["echo", "{{static:data}}", "{{static:nope}}"])
    assert r.stdout == "{{static:data}} {{static:nope}}\n"
    with pytest.raises(UsageError, match="no static asset named 'nope'"):
        rt.static_path("nope")
    with pytest.raises(UsageError, match="no command named 'nope'"):
        rt.file_command("nope")


def test_static_assets_are_read_only(rt: Runtime, conformance_target: Target) -> None:
    skip_if(conformance_target, "static-read-only-as-root", when=os.geteuid() == 0)
    hello = f"{rt.static_path('data')}/hello.txt"
    r = rt.execute(["sh", "-c", 'echo x > "$1"', "sh", hello])
    assert r.exit_code != 0
    assert rt.execute(["cat", hello]).stdout == "static hello\n"


# ----- folders -------------------------------------------------------------------------------
def _tree(root: Path) -> dict[str, tuple[str, str]]:
    """name -> (kind and mode, content or link target), for comparing two trees."""
    out = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[name] = ("link", os.readlink(path))
        elif path.is_dir():
            out[name] = (f"dir {path.stat().st_mode & 0o777:o}", "")
        else:
            out[name] = (f"file {path.stat().st_mode & 0o777:o}", path.read_bytes().hex())
    return out


def test_folder_round_trip_keeps_modes_links_and_bytes(rt: Runtime, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "deep" / "er").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "deep" / "er" / "data.bin").write_bytes(bytes(range(256)) * 64)
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("deep/er/data.bin")
    (src / "h\u00e9 llo.txt").write_text("spaces and \u00e9")
    dest = f"up-{uuid.uuid4().hex[:8]}"
    rt.upload(src, dest)
    assert rt.execute(["sh", f"{dest}/run.sh"]).stdout == "ran\n"
    assert rt.execute(["readlink", f"{dest}/link"]).stdout == "deep/er/data.bin\n"
    owner = rt.execute(stat_argv("%u", f"{dest}/run.sh")).stdout.strip()
    assert owner == rt.execute(["id", "-u"]).stdout.strip()  # the command user's, not ours
    names = rt.download(dest, tmp_path / "back")
    assert _tree(tmp_path / "back") == _tree(src)
    assert sorted(names) == sorted(_tree(src))


def test_folder_transfer_errors(rt: Runtime, tmp_path: Path) -> None:
    name = f"t-{uuid.uuid4().hex[:8]}"
    rt.write_file(f"{name}/file", "x")
    (tmp_path / "src").mkdir()
    with pytest.raises(NotADirectoryError):
        rt.upload(tmp_path / "src", f"{name}/file")
    with pytest.raises(NotADirectoryError):
        rt.download(f"{name}/file", tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        rt.download(f"{name}/missing", tmp_path / "out")
    with pytest.raises(FileNotFoundError):  # the path's words are not the reason's
        rt.download(f"{name}/no-permission-here", tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        rt.read_file(f"{name}/Permission denied")
    rt.execute(f"mkfifo {name}-fifo")  # opened, it would wait for a writer: it is not
    started = time.monotonic()
    with pytest.raises(NotADirectoryError):
        rt.download(f"{name}-fifo", tmp_path / "out", timeout=20)
    assert time.monotonic() - started < 10
    with pytest.raises(UsageError):
        rt.upload(tmp_path / "no-such-folder", name)
    rt.write_file(f"{name}/big", "y" * 20000)
    with pytest.raises(OutputLimitExceeded):
        rt.download(name, tmp_path / "out", limit=10000)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_download_cannot_write_outside_its_folder(rt: Runtime, tmp_path: Path) -> None:
    name = f"evil-{uuid.uuid4().hex[:8]}"
    rt.execute(f"mkdir -p {name} && ln -s /etc {name}/escape && echo ok > {name}/a")
    out = tmp_path / "out"
    with pytest.raises(SandboxUnsafeArchive):
        rt.download(name, out)
    assert list(out.iterdir()) == []  # nothing written, not even the private staging folder


def test_a_download_merges_into_what_the_folder_holds(rt: Runtime, tmp_path: Path) -> None:
    name = f"merge-{uuid.uuid4().hex[:8]}"
    rt.execute(f"mkdir -p {name}/d && echo new > {name}/d/same && echo add > {name}/d/added")
    out = tmp_path / "out"
    (out / "d").mkdir(parents=True)
    (out / "d" / "same").write_text("old\n")
    (out / "mine").write_text("kept\n")
    assert sorted(rt.download(name, out)) == ["d", "d/added", "d/same"]
    assert (out / "d" / "same").read_text() == "new\n" and (out / "d" / "added").exists()
    assert sorted(p.name for p in out.iterdir()) == ["d", "mine"]  # no staging folder left
