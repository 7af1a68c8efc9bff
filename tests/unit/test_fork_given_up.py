"""A fork given up (services/suspend.py `_GivenUp`): the copies made by then go at once,
and one still starting goes as soon as it is up, whoever interrupts the caller meanwhile."""

from __future__ import annotations

import contextlib
import functools
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from orchestrator import Runtime
from orchestrator.errors import OrchestratorError, SandboxUnavailable, UsageError
from orchestrator.sandbox import snapshot
from orchestrator.sandbox.snapshot import Snapshot, snapshots_dir
from orchestrator.services import suspend
from orchestrator.services.suspend import _GivenUp


class Copy:
    def __init__(self) -> None:
        self.removed = threading.Event()

    def cleanup(self) -> None:
        self.removed.set()


class Failing(Copy):
    def cleanup(self) -> None:
        self.removed.set()
        raise RuntimeError("its removal failed")


def made(kind: type[Copy]) -> tuple[Copy, Runtime]:
    copy = kind()
    return copy, cast(Runtime, copy)


def test_copies_made_go_and_one_still_starting_goes_once_up() -> None:
    given_up = _GivenUp()
    copies = [made(Copy), made(Failing), made(Copy)]
    for _, runtime in copies:
        given_up.kept(functools.partial(lambda r: r, runtime))
    given_up.remove_all()  # a failing removal does not keep the others
    assert all(c.removed.is_set() for c, _ in copies)
    late, runtime = made(Copy)
    with pytest.raises(OrchestratorError, match="given up"):
        given_up.kept(lambda: runtime)
    assert late.removed.is_set()


def test_a_fork_not_given_up_keeps_its_copies() -> None:
    given_up = _GivenUp()
    copy, runtime = made(Copy)
    assert given_up.kept(lambda: runtime) is runtime
    assert not copy.removed.is_set()


class Original:
    """A stand-in environment whose save hands its record on, then fails to start again."""

    name, env = "docker", object()
    options = SimpleNamespace(host="", mounts=[], env_vars={}, policy=None)

    def __init__(self, record: Snapshot) -> None:
        self.record = record

    def memory_refusal(self) -> None:
        return None

    def _save_whole(
        self,
        *_: object,
        meanwhile: Callable[[Snapshot], object],
        handed: list[Snapshot],
        **__: object,
    ) -> None:
        handed.append(self.record)  # the fork's from now on
        meanwhile(self.record)  # the copies begin while it starts again
        time.sleep(0.2)
        raise SandboxUnavailable("the original could not be started again")


def test_copies_begun_while_the_original_fails_to_start_again_all_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies: list[Copy] = []

    def woken(*_: object, **__: object) -> Runtime:
        copies.append(Copy())
        return cast(Runtime, copies[-1])

    monkeypatch.setattr(suspend, "wake", woken)
    record = Snapshot(tmp_path / "r.tar", "", "", "", 0, "", "", "docker", {})
    (tmp_path / "r.tar").write_bytes(b"")
    with pytest.raises(SandboxUnavailable, match="started again"):
        suspend.fork(cast(Runtime, Original(record)), 3)
    assert len(copies) == 3 and all(c.removed.is_set() for c in copies)
    assert not (tmp_path / "r.tar").exists()  # the record went with them


class Saver(Runtime):
    """The real `_save_whole` around a stand-in save: its record is written, then the
    sandbox fails to start again from it (the end of `_memory_held`)."""

    name = "docker"

    def __init__(self, env_name: str) -> None:  # (no environment behind it)
        self.env = cast(object, SimpleNamespace(name=env_name))  # type: ignore[assignment]

    def _check_usable(self) -> None:
        pass

    @contextlib.contextmanager
    def _memory_held(self, folder: Path) -> Iterator[dict[str, str]]:
        yield {}
        raise SandboxUnavailable("the original could not be started again")

    def _save_files(
        self, path: Path, *, keep: bool, quiet: bool, memory: dict[str, str]
    ) -> Snapshot:
        return snapshot.save(b"", self.env.name, "", path, backend="docker", suspended=True)


Saver.__abstractmethods__ = frozenset()


@pytest.mark.parametrize("began", [True, False], ids=["copies-began", "no-copies"])
def test_a_record_copies_began_from_is_left_to_the_fork_when_the_original_fails(
    began: bool,
) -> None:
    """It was removed at once, files and images, while the copies begun from it were still
    starting from them; now the fork removes it once they are gone (above). A save that
    began nothing still removes its own record."""
    handed: list[Snapshot] = []
    seen: list[Snapshot] = []
    saver = Saver(f"saver-{began}")  # type: ignore[abstract]
    with pytest.raises(SandboxUnavailable, match="started again"):
        saver._save_whole(
            None,
            keep=False,
            quiet=False,
            memory=True,
            meanwhile=seen.append if began else None,
            handed=handed if began else None,
        )
    if began:
        assert seen == handed  # handed over before the copies began
        assert len(handed) == 1 and handed[0].path.exists()
        assert handed[0].path.with_suffix(".json").exists()
        handed[0].remove()
    else:
        assert not list(snapshots_dir().glob(f"saver-{began}*"))


def test_a_second_ctrl_c_while_a_failed_fork_ends_leaves_no_copy_and_no_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second Ctrl-C while the fork waited for its copies still starting cut the wait
    short: the record (memory files, archive) stayed for the life of the process, or went
    while copies still ran. The end is a thread of its own, which goes on after the wait
    is cut: every copy goes, then the record."""
    order: list[str] = []
    copies: list[Copy] = []

    class Noted(Copy):
        def cleanup(self) -> None:
            order.append("copy")
            super().cleanup()

    def woken(*_: object, **__: object) -> Runtime:
        time.sleep(0.5)  # still starting when the fork fails
        copies.append(Noted())
        return cast(Runtime, copies[-1])

    class Cut(threading.Thread):
        def join(self, timeout: float | None = None) -> None:
            if self.name == "orchestrator-fork-end" and not getattr(self, "cut", False):
                self.cut = True
                raise KeyboardInterrupt  # the second Ctrl-C, while the fork waits
            super().join(timeout)

    monkeypatch.setattr(suspend, "wake", woken)
    monkeypatch.setattr(threading, "Thread", Cut)
    record = Snapshot(tmp_path / "r.tar", "", "", "", 0, "", "", "docker", {})
    (tmp_path / "r.tar").write_bytes(b"")
    (tmp_path / "r.memory").mkdir()
    (tmp_path / "r.memory" / "pages.img").write_bytes(b"memory")
    real_remove = Snapshot.remove

    def remove(snap: Snapshot) -> None:
        order.append("record")
        real_remove(snap)

    monkeypatch.setattr(Snapshot, "remove", remove)
    with pytest.raises(KeyboardInterrupt):
        suspend.fork(cast(Runtime, Original(record)), 2)
    for thread in threading.enumerate():
        if thread.name == "orchestrator-fork-end":
            thread.join(30)
    assert len(copies) == 2 and all(c.removed.is_set() for c in copies)
    assert order == ["copy", "copy", "record"], order
    assert not (tmp_path / "r.tar").exists() and not (tmp_path / "r.memory").exists()


class Packer(Runtime):
    """The real `_save_whole` and `_save_files` around stand-ins for the engine: the memory
    image is a folder the restart (the end of `_memory_held`) reads again, as gVisor's."""

    name = "docker"

    def __init__(self, env_name: str, *, pack_fails: bool = False) -> None:
        self.env = cast(object, SimpleNamespace(name=env_name, digest="d", source=""))  # type: ignore[assignment]
        self.options = cast(object, SimpleNamespace(host=""))  # type: ignore[assignment]
        self.pack_fails, self.restarted_from = pack_fails, cast(list[bool], [])
        self.inside: Callable[[], object] = lambda: None

    def _check_usable(self) -> None:
        pass

    def _engine(self) -> str:
        return ""

    @contextlib.contextmanager
    def _memory_held(self, folder: Path) -> Iterator[dict[str, str]]:
        self.inside()  # (the engine asked about the sandbox: nothing of the save made yet)
        folder.mkdir(mode=0o700)
        (folder / "pages.img").write_bytes(b"memory")
        try:
            yield {"pages.img": "x"}
        finally:  # the sandbox starts again from its image, whatever happened
            self.restarted_from.append((folder / "pages.img").exists())

    def _pack_workdir_file(
        self, folder: Path, user: str | None, limit: int, timeout: float | None = None
    ) -> Path:
        if self.pack_fails:
            raise OrchestratorError("the workspace is over the snapshot limit")
        packed = folder / f".packed-{uuid.uuid4().hex}"
        packed.write_bytes(b"")
        return packed


Packer.__abstractmethods__ = frozenset()


def _save_noting(packer: Packer, name: str, refused: list[BaseException]) -> None:
    """`packer` saves `name` with memory; what it raises goes in `refused`."""
    try:
        packer._save_whole(name, keep=True, quiet=False, memory=True)
    except BaseException as exc:
        refused.append(exc)


def test_a_save_that_fails_leaves_the_sandbox_its_memory_image_to_start_again_from() -> None:
    """A save whose packing failed removed the memory image with its other files before
    the sandbox was started again from it: the sandbox stayed stopped, its processes
    lost. The image now goes after that start."""
    packer = Packer("packfail", pack_fails=True)  # type: ignore[abstract]
    with pytest.raises(OrchestratorError, match="snapshot limit"):
        packer._save_whole("packfail", keep=True, quiet=False, memory=True)
    assert packer.restarted_from == [True]
    assert not list(snapshots_dir().glob("packfail*"))


def test_one_save_of_a_name_at_a_time_and_a_refused_one_removes_nothing() -> None:
    """Two saves of one name at once: the second removed the first's memory image (its own
    cleanup, of a folder it never made) while the first still wrote it. The second is now
    refused before it makes anything; the first saves whole. A dotted name is a name too,
    saved in the snapshots folder (it went to the current folder) and found by it."""
    first, second = Packer("a"), Packer("b")  # type: ignore[abstract]
    refused: list[BaseException] = []
    first.inside = functools.partial(_save_noting, second, "v1.2", refused)
    saved = first._save_whole("v1.2", keep=True, quiet=False, memory=True)
    assert len(refused) == 1 and isinstance(refused[0], UsageError), refused
    assert "being saved by another process" in str(refused[0])
    assert first.restarted_from == [True] and second.restarted_from == []
    assert saved.path == snapshots_dir() / "v1.2.tar" and saved.memory_folder.exists()
    assert Snapshot.find("v1.2") == saved
    saved.remove()


def test_a_save_takes_over_the_name_of_one_no_longer_running() -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    folder = snapshots_dir()
    folder.mkdir(parents=True, exist_ok=True)
    pending = folder / f"taken{snapshot.PENDING_SUFFIX}"
    pending.write_text(f"{dead.stdout.strip()} 1 {socket.gethostname()}\n")
    with snapshot.saving(folder / "taken.json"):
        assert snapshot.being_saved(folder / "taken.json")
        with (
            pytest.raises(UsageError, match="being saved"),  # (this process: running)
            snapshot.saving(folder / "taken.json"),
        ):
            pass
        assert pending.exists()  # (the refused one did not remove it)
    assert not pending.exists()


def test_a_save_that_waited_for_its_name_finds_it_taken_and_removes_nothing() -> None:
    """A second save of a name asked whether it was free before it held it: one that
    waited for the first (its files not made yet when it asked) then saved over it, and
    its cleanup removed the first's record, archive and memory image."""
    first, second = Packer("a"), Packer("b")  # type: ignore[abstract]
    refused: list[BaseException] = []
    waiting = threading.Thread(target=_save_noting, args=(second, "twice", refused))

    def meanwhile() -> None:  # it asks while the first holds the name, nothing made yet,
        waiting.start()  # then waits for the name (at most snapshot.CLAIM_WAIT)
        time.sleep(0.5)

    first.inside = meanwhile
    saved = first._save_whole("twice", keep=True, quiet=False, memory=True)
    waiting.join(30)
    assert len(refused) == 1 and "already" in str(refused[0]), refused
    assert saved.path.exists() and saved.record.exists() and saved.memory_folder.exists()
    assert second.restarted_from == []
    saved.remove()


def test_a_ctrl_c_as_the_forks_end_begins_does_not_skip_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C landing while the thread that ends a failed fork was being made skipped
    it: the copies begun and the record stayed for the life of the process. It is held
    until that thread runs, then raised."""
    import os
    import signal

    copies: list[Copy] = []

    def woken(*_: object, **__: object) -> Runtime:
        copies.append(Copy())
        return cast(Runtime, copies[-1])

    class Interrupted(threading.Thread):
        def __init__(self, *args: object, **kwargs: object) -> None:
            if kwargs.get("name") == "orchestrator-fork-end":
                os.kill(os.getpid(), signal.SIGINT)  # (acted on at the next bytecode)
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(suspend, "wake", woken)
    monkeypatch.setattr(threading, "Thread", Interrupted)
    record = Snapshot(tmp_path / "r.tar", "", "", "", 0, "", "", "docker", {})
    (tmp_path / "r.tar").write_bytes(b"")
    with pytest.raises(KeyboardInterrupt):
        suspend.fork(cast(Runtime, Original(record)), 2)
    monkeypatch.undo()
    for thread in threading.enumerate():
        if thread.name == "orchestrator-fork-end":
            thread.join(30)
    assert len(copies) == 2 and all(c.removed.is_set() for c in copies)
    assert not (tmp_path / "r.tar").exists()
