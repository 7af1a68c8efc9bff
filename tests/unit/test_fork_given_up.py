"""A fork given up (services/suspend.py `_GivenUp`): the copies made by then go at once,
and one still starting goes as soon as it is up, whoever interrupts the caller meanwhile."""

from __future__ import annotations

import functools
import threading
from typing import cast

import pytest

from orchestrator import Runtime
from orchestrator.errors import OrchestratorError
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
