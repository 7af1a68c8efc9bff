"""A workspace snapshot on Docker is written by the host's tar straight into its file, and
put back (restore, resume) by the kernel feeding that file into a FIFO the sandbox's tar
reads: never whole in this process's memory, never through the engine's exec stream. What
comes back is the workspace as it was; a bad archive, a limit or a sandbox that stops
reading ends in an error, within a bound, with nothing left behind."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator import OrchestratorError, OutputLimitExceeded, spawn_runtime
from orchestrator.backends.container import channel
from orchestrator.backends.docker.runtime import ComposeRuntime
from orchestrator.sandbox import hostpack
from orchestrator.sandbox.options import Chunks, Command
from tests.docker.conftest import MakeEnv, within

TREE = (
    "mkdir -p tree/d sub && for i in $(seq 60); do head -c 70000 /dev/urandom > tree/d/f$i; "
    "done && ln -s d/f1 tree/link && chmod 0750 tree/d/f2 && chown 1234:5678 tree/d/f3"
)
SUMS = "cd tree && find . -type f -exec sha256sum {} + | sort && stat -c '%n %a %u:%g' d/f2 d/f3"


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What the sandbox's side of each restore read: the FIFO it was handed (None: the
    engine's exec stream)."""
    fed: list[Any] = []
    real = channel.Channel._run

    def spy(self: channel.Channel, cmd: Command, **kwargs: Any) -> Chunks:
        if any("tar -x" in arg for arg in cmd.argv):
            fed.append(kwargs.get("into"))
        return real(self, cmd, **kwargs)

    monkeypatch.setattr(channel.Channel, "_run", spy)
    return fed


def _feeders_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "FileInto" and t.is_alive()]


def test_snapshot_restore_and_resume_go_through_fifos_and_keep_everything(
    make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed = _spy(monkeypatch)
    env = make_env("user: root\n", name="snapstream")
    with spawn_runtime(env) as rt:
        assert isinstance(rt, ComposeRuntime)
        rt.execute(TREE, check=True)
        before = rt.execute(SUMS, check=True).stdout
        snap = rt.snapshot(tmp_path / "snaps" / "s.tar")
        assert snap.size == snap.path.stat().st_size > 60 * 70000
        assert [p.name for p in snap.path.parent.iterdir()] == ["s.json", "s.tar"]  # no part
        rt.execute("rm -rf tree/d && echo junk > tree/new", check=True)
        rt.restore(snap)
        assert rt.execute(SUMS, check=True).stdout == before
        assert rt.execute("test ! -e tree/new && readlink tree/link").stdout == "d/f1\n"
    with spawn_runtime(env, resume=snap) as resumed:
        assert resumed.execute(SUMS, check=True).stdout.split("d/f2")[0] == before.split("d/f2")[0]
    assert len(fed) == 2 and all(fifo is not None for fifo in fed)  # never the exec stream
    assert _feeders_alive() == []


def test_a_snapshot_past_its_limit_leaves_no_file(make_env: MakeEnv, tmp_path: Path) -> None:
    with spawn_runtime(make_env("", name="snaplimit")) as rt:
        rt.execute(TREE.split(" && ln")[0], check=True)
        with pytest.raises(OutputLimitExceeded, match="limit of 1000000 bytes"):
            rt.snapshot(tmp_path / "snaps" / "big.tar", limit=1_000_000)
        assert list((tmp_path / "snaps").iterdir()) == []
        assert not list((tmp_path / "snaps").glob(f"*{hostpack.PART}"))


@pytest.mark.parametrize("damage", ["garbage", "cut"])
def test_a_damaged_snapshot_fails_the_restore_within_a_bound(
    make_env: MakeEnv, tmp_path: Path, damage: str
) -> None:
    """An archive the sandbox's tar refuses part way (its FIFO full, nobody reading): the
    restore ends with an error, the feeder ends with it, and the environment still runs."""
    with spawn_runtime(make_env("user: root\n", name="snapbad")) as rt:
        rt.execute(TREE, check=True)
        snap = rt.snapshot(tmp_path / "s.tar")
        data = snap.path.read_bytes()
        if damage == "garbage":
            snap.path.write_bytes(data[:1024] + b"\xff" * 24 * (1 << 20))
        else:
            snap.path.write_bytes(data[: len(data) // 2])
        with pytest.raises(OrchestratorError, match="reset"):
            within(60, lambda: rt.restore(snap))
        assert _feeders_alive() == []
        assert rt.execute("echo alive").stdout == "alive\n"


def test_a_snapshot_file_that_is_a_fifo_is_refused_at_once(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    with spawn_runtime(make_env("", name="snapfifo")) as rt:
        snap = rt.snapshot(tmp_path / "s.tar")
        snap.path.unlink()
        os.mkfifo(snap.path)  # a reader of it would wait for a writer forever
        with pytest.raises(OrchestratorError, match="not a regular file"):
            within(10, lambda: rt.restore(snap))
        assert _feeders_alive() == []
