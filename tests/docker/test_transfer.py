"""Folders to and from a Docker sandbox on this machine go through FIFOs in its transfer
folder, not the engine's exec stream: what the sandbox can do to such a FIFO, a user who
cannot reach it, and a transfer stopped half way."""

from __future__ import annotations

import functools
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator import OutputLimitExceeded, UsageError, procutil, spawn_runtime
from orchestrator.backends.container import channel
from orchestrator.backends.docker.runtime import ComposeRuntime
from orchestrator.sandbox import files, hostpack
from orchestrator.sandbox.options import Chunks, Command
from tests.docker.conftest import BUSYBOX_IMAGE, MakeEnv
from tests.docker.conftest import same_tree as _same
from tests.docker.conftest import within as _within

TREE = "mkdir -p tree/d && for i in $(seq 40); do head -c 50000 /dev/urandom > tree/d/f$i; done"


def _fifos(rt: ComposeRuntime) -> list[str]:
    assert rt.project is not None
    return [p.name for p in (rt.project.directory / "io" / "main").iterdir() if p.is_fifo()]


def test_folders_go_both_ways_through_fifos_gone_after(
    make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outs: list[int | None] = []  # for each run of the download helper: its FIFO
    packers: list[hostpack.TarInto | None] = []
    real_run, real_pack = channel.Channel._run, hostpack.PackStream.pack_into

    def spy(self: channel.Channel, cmd: Command, **kwargs: Any) -> Chunks:
        if files.DOWNLOAD in cmd.argv:
            outs.append(kwargs.get("out"))
        return real_run(self, cmd, **kwargs)

    def spy_pack(stream: hostpack.PackStream, fd: int) -> hostpack.TarInto | None:
        packers.append(real_pack(stream, fd))
        return packers[-1]

    monkeypatch.setattr(channel.Channel, "_run", spy)
    monkeypatch.setattr(hostpack.PackStream, "pack_into", spy_pack)
    with spawn_runtime(make_env("", name="fifo")) as rt:
        assert isinstance(rt, ComposeRuntime)
        rt.execute(TREE, check=True)
        rt.download("tree", tmp_path / "out")
        assert _same(rt, tmp_path / "out")
        assert outs and all(out is not None for out in outs)  # no byte through the engine
        rt.upload(tmp_path / "out", "again")
        assert len(packers) == 1 and packers[0] is not None  # the host's tar into a FIFO
        assert rt.execute("diff -r tree again").exit_code == 0
        assert _fifos(rt) == []


def test_a_sandbox_holding_the_fifo_open_cannot_hold_a_download(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """A process of the sandbox opens every FIFO it sees and keeps it open: the end of file
    never comes, yet the download ends once the packer has exited and the FIFO is quiet."""
    with spawn_runtime(make_env("", name="holder")) as rt:
        assert isinstance(rt, ComposeRuntime)
        rt.execute(TREE, check=True)
        grab = (
            'while :; do for f in /.orchestrator-io/out-*; do [ -p "$f" ] || continue; '
            '[ -e "/tmp/held-${f##*/}" ] && continue; touch "/tmp/held-${f##*/}"; '
            'sleep 60 > "$f" & done; done'
        )
        rt.execute(f"nohup sh -c '{grab}' >/dev/null 2>&1 &", check=True)
        for n in range(3):
            out = tmp_path / f"out{n}"
            _within(15, functools.partial(rt.download, "tree", out))
            assert _same(rt, out)
        held = rt.execute("ls /tmp | grep -c '^held-out-'").stdout.strip()
        assert int(held) >= 1, "the holder never caught a FIFO: this test tested nothing"


def test_a_user_who_cannot_reach_the_fifos_goes_through_the_engine(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    with spawn_runtime(make_env("user: '1000:1000'\n", name="noreach")) as rt:
        assert isinstance(rt, ComposeRuntime) and rt.project is not None
        rt.execute(TREE, check=True)
        rt.download("tree", tmp_path / "root", user="root")  # checked once, as root: works
        shared = rt.project.directory / "io" / "main"
        mode = shared.stat().st_mode
        shared.chmod(0o700)  # now only root may pass
        try:
            rt.upload(tmp_path / "root", "up")
            rt.download("tree", tmp_path / "user")
        finally:
            shared.chmod(mode)
        assert _same(rt, tmp_path / "user") and _fifos(rt) == []
        assert rt.execute("diff -r tree up && stat -c %u up/d/f1").stdout == "1000\n"


def test_a_download_stopped_half_way_leaves_no_packer_running(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    with spawn_runtime(make_env("", name="stopped")) as rt:
        assert isinstance(rt, ComposeRuntime)
        rt.execute("mkdir big && head -c 20000000 /dev/urandom > big/blob", check=True)
        with pytest.raises(OutputLimitExceeded):
            rt.download("big", tmp_path / "out", limit=1_000_000)
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
        scan = 'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < "$f"; echo; done'
        assert "tar -c" not in rt.execute(scan).stdout
        assert _fifos(rt) == []


def test_where_no_fifo_can_be_made_downloads_go_through_the_engine(
    make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(path: object, mode: int = 0o666) -> None:
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(os, "mkfifo", refuse)
    with spawn_runtime(make_env("", name="nofifo")) as rt:
        assert isinstance(rt, ComposeRuntime)
        rt.execute(TREE, check=True)
        rt.download("tree", tmp_path / "out")
        assert _same(rt, tmp_path / "out") and _fifos(rt) == []


def test_an_upload_the_sandbox_refuses_stops_the_hosts_tar(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    tree = tmp_path / "big"
    tree.mkdir()
    (tree / "blob").write_bytes(os.urandom(8_000_000))  # more than the FIFO holds
    with spawn_runtime(make_env("", name="refused")) as rt:
        assert isinstance(rt, ComposeRuntime)
        rt.write_file("a-file", "x")
        with pytest.raises(NotADirectoryError):
            _within(15, lambda: rt.upload(tree, "a-file"))
        running = subprocess.run(["pgrep", "-f", f"-C {tree} "], capture_output=True)
        assert running.stdout == b"" and _fifos(rt) == []


def test_an_upload_whose_packer_fails_at_once_ends_with_its_error(
    make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's tar dies before writing a byte, perhaps before the sandbox opened the
    FIFO: the sandbox still gets its end of file, and tar's own complaint is the error."""
    real = hostpack.tar_argv
    monkeypatch.setattr(hostpack, "tar_argv", lambda tar, folder: real(tar, tmp_path / "gone"))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_text("x")
    with spawn_runtime(make_env("", name="packfail", image=BUSYBOX_IMAGE)) as rt:
        assert isinstance(rt, ComposeRuntime)
        for _ in range(3):
            with pytest.raises(UsageError, match="gone"):
                _within(15, lambda: rt.upload(tmp_path / "src", "dest"))
        assert _fifos(rt) == []


@pytest.mark.parametrize("mode", ["executor", "plain"])
def test_a_slow_reader_gets_all_an_archive_left_in_the_fifo(
    make_env: MakeEnv, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The packer is done with the FIFO long before a slow caller has read it all: the time
    the caller holds each chunk is not quiet, so nothing is cut."""
    monkeypatch.setenv("ORCHESTRATOR_EXEC_MODE", mode)
    with spawn_runtime(make_env("", name="slow")) as rt:
        assert isinstance(rt, ComposeRuntime) and rt._main is not None
        rt.execute("mkdir big && head -c 1000000 /dev/urandom > big/blob", check=True)
        cmd = Command(files.download_argv(f"{rt.workdir}/big"), {}, "/", None, None, None)
        got, chunks = 0, rt._main.run(cmd, bulk=True)
        while True:
            try:
                kind, data = next(chunks)
            except StopIteration as stop:
                assert stop.value.exit_code == 0
                break
            if kind == "stdout":
                got += len(data)
                time.sleep(procutil.DRAIN_MAX / 2)
        assert got >= 1_000_000 + 1024 and rt.info().exec_mode == mode
