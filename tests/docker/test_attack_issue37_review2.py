"""Hostile review of issue 37's defaults, permissions and downloads (second review): a
download written through a link the sandbox put at its destination, folders made with the
caller's umask, a file lifting its own process ceiling. Each fails on the code before."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import (
    OutputLimitExceeded,
    SpecError,
    UsageError,
    load_environment,
    spawn_runtime,
)
from tests.conftest import PYTHON_IMAGE


@pytest.fixture
def umask0() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _env(folder: Path, body: str = "") -> Path:
    path = folder / "env.yaml"
    path.write_text(f"version: 1\nname: r2dl\nimage: {PYTHON_IMAGE}\nuser: root\n{body}")
    return path


def test_a_download_never_writes_through_a_link_the_sandbox_put(tmp_path: Path) -> None:
    """A root sandbox put `collected -> /a/root/only/folder` in its workspace; the caller's
    `download(..., ws / "collected")` wrote the sandbox's files there (as the caller). A
    link inside a folder the sandbox writes refuses the download, at the destination and
    on the way to it; nothing lands in the target. A caller's own link elsewhere is still
    followed."""
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    ws = tmp_path / "ws"
    with spawn_runtime(load_environment(_env(tmp_path)), workspace=ws) as rt:
        rt.execute(
            "mkdir -p out real && echo planted > out/authorized_keys && "
            f"ln -s {target} collected && ln -s {target} real/sub"
        )
        for dest in (ws / "collected", ws / "collected" / "deeper", ws / "real" / "sub"):
            with pytest.raises(UsageError, match="link inside a folder the sandbox writes"):
                rt.download("out", dest)
        assert os.listdir(target) == []
        mine = tmp_path / "mine"
        mine.mkdir()
        (tmp_path / "alias").symlink_to(mine)
        rt.download("out", tmp_path / "alias" / "got")
        assert (mine / "got" / "authorized_keys").read_text() == "planted\n"


def test_what_a_download_and_a_workspace_make_is_private_whatever_the_umask(
    tmp_path: Path, umask0: None
) -> None:
    """Under umask 0 a download's missing folders were made 0777 (another user swapped the
    folder, or read what landed), and so was the caller's workspace. Both are made 0700."""
    ws = tmp_path / "a" / "ws"
    with spawn_runtime(load_environment(_env(tmp_path)), workspace=ws) as rt:
        rt.execute("mkdir -p out && echo secret > out/s")
        rt.download("out", tmp_path / "b" / "down")
    for folder in (tmp_path / "a", tmp_path / "b", tmp_path / "b" / "down"):
        assert folder.stat().st_mode & 0o077 == 0, oct(folder.stat().st_mode)


def test_a_file_cannot_lift_its_own_process_ceiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`resources: {pids: 4000000}` gave pids.max 4,000,000 (3,000 threads started, host
    pid_max 32,768). Above the caller's ceiling (ORCHESTRATOR_MAX_PIDS, 4096) it is refused
    at its field; the caller may raise the ceiling."""
    path = _env(tmp_path, "resources: {pids: 4000000}\n")
    with pytest.raises(SpecError, match=r"resources\.pids") as err:
        spawn_runtime(load_environment(path))
    assert "ORCHESTRATOR_MAX_PIDS=4000000" in str(err.value)
    monkeypatch.setenv("ORCHESTRATOR_MAX_PIDS", "5000")
    path.write_text(path.read_text().replace("4000000", "4500"))
    with spawn_runtime(load_environment(path)) as rt:
        assert (
            rt.execute(
                "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max"
            ).stdout.strip()
            == "4500"
        )


def test_a_sparse_file_over_the_limit_is_refused_at_once_in_busybox(tmp_path: Path) -> None:
    """Third review: over the limit, read_file measured the file with `wc -c`, which in
    busybox reads every byte: a 40 GiB sparse answer.txt held the call to its deadline. Its
    size is read from its inode now."""
    path = tmp_path / "env.yaml"
    path.write_text("version: 1\nname: sparse\nimage: orchestrator-test/busybox:1\n")
    with spawn_runtime(load_environment(path)) as rt:
        rt.execute(
            "truncate -s 40G answer.txt 2>/dev/null || dd of=answer.txt bs=1 seek=40G count=0"
        )
        started = time.monotonic()
        with pytest.raises(OutputLimitExceeded):
            rt.read_file("answer.txt", timeout=60)
        assert time.monotonic() - started < 20


def test_a_download_never_widens_a_folder_of_the_callers(tmp_path: Path) -> None:
    """Third review: the merge copied the sandbox folder's mode onto the caller's existing
    folder: a private `results/` (0700) holding a key became 0755 for any user to read."""
    dest = tmp_path / "results"
    dest.mkdir(mode=0o700)
    (dest / "key").write_text("k")
    with spawn_runtime(load_environment(_env(tmp_path))) as rt:
        rt.execute("mkdir -p out && chmod 755 out && echo x > out/new")
        rt.download("out", dest)
    assert dest.stat().st_mode & 0o777 == 0o700 and (dest / "new").exists()
