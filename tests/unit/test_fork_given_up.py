"""A fork given up (services/suspend.py `_GivenUp`): the copies made by then go at once,
and one still starting goes as soon as it is up, whoever interrupts the caller meanwhile."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from orchestrator import Runtime
from orchestrator.errors import OrchestratorError, SandboxUnavailable
from orchestrator.sandbox.snapshot import Snapshot
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
        self, *_: object, meanwhile: Callable[[Snapshot], object], **__: object
    ) -> None:
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
