"""The test world's close (orchestrator/testing/world.py) when a removal outlives its call's
bound on a loaded engine: asked for again, and only what is still there is an error."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from orchestrator.testing import world as world_mod


def test_a_network_removal_that_outlived_its_call_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI, once: `docker network rm` of the world's network took over 30 s while 64
    environments made their networks, and the test failed though the engine removed it."""
    calls: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if argv[1:3] == ["network", "rm"] and len(calls) == 2:
            raise subprocess.TimeoutExpired(argv, 30.0)
        gone = "No such network" if argv[1:3] == ["network", "rm"] else "No such container"
        return subprocess.CompletedProcess(argv, 1 if len(calls) > 2 else 0, "", gone)

    monkeypatch.setattr("orchestrator.testing.world.subprocess.run", run)
    monkeypatch.setattr(world_mod, "LATE_PAUSES", (0.0, 0.0, 0.0))
    world = world_mod.World(
        network="w", subnet="", resolver_ip="", hosts={}, network_id="n1", containers=["c1"]
    )
    world.close()  # no RuntimeError: the second look finds it gone
    assert [c[1:3] for c in calls].count(["network", "rm"]) == 2


def test_what_is_still_there_after_every_look_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        if argv[1:3] == ["network", "rm"]:
            return subprocess.CompletedProcess(argv, 1, "", "has active endpoints")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr("orchestrator.testing.world.subprocess.run", run)
    monkeypatch.setattr(world_mod, "LATE_PAUSES", (0.0, 0.0))
    world = world_mod.World(network="w", subnet="", resolver_ip="", hosts={}, network_id="n1")
    with pytest.raises(RuntimeError, match="has active endpoints") as raised:
        world.close()
    assert str(raised.value).count("has active endpoints") == 1  # the last look's alone
