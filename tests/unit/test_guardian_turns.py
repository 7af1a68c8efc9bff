"""The guardian of a dead owner lets its projects stop themselves (the sandbox at once, the
services in their tethers' turns) before it removes them, within a bound: removing them
meanwhile takes endpoints of one network away beside theirs (removal.leave_networks)."""

from __future__ import annotations

import time

import pytest

from orchestrator.backends.container import guardian, removal
from orchestrator.backends.container.projects import ProjectInfo


def _project(name: str, states: list[str], networks: int = 1) -> ProjectInfo:
    info = ProjectInfo(name, {}, [], [f"net{i}" for i in range(networks)])
    info.containers = [(f"{name}-{i}", f"s{i}", state) for i, state in enumerate(states)]
    return info


def test_it_waits_until_they_stopped_themselves() -> None:
    looks = [["running", "running"], ["running", "exited"], ["exited", "exited"]]
    seen: list[int] = []

    def listing() -> list[ProjectInfo]:
        seen.append(1)
        return [_project("p", looks[min(len(seen) - 1, len(looks) - 1)])]

    guardian._let_them_stop([_project("p", ["running", "running"])], listing)
    assert len(seen) == 3  # it looked until none ran, then stopped looking


def test_it_waits_no_longer_than_the_turns_and_a_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(removal, "TURN", 0.1)
    monkeypatch.setattr(removal, "STOP_AFTER_TURNS", 0.5)
    start = time.monotonic()
    guardian._let_them_stop(
        [_project("p", ["running"] * 3)], lambda: [_project("p", ["running"] * 3)]
    )
    took = time.monotonic() - start
    assert 0.7 <= took < 2.0, took  # 3 turns of 0.1 s and a stop of 0.5 s


@pytest.mark.parametrize(
    "owned", [[_project("lone", ["running"])], [_project("none", ["running"] * 2, networks=0)]]
)
def test_a_project_that_cannot_race_is_not_waited_for(owned: list[ProjectInfo]) -> None:
    """One container alone, or containers on no network, take no endpoint away together."""

    def listing() -> list[ProjectInfo]:
        raise AssertionError("not looked at")

    guardian._let_them_stop(owned, listing)
