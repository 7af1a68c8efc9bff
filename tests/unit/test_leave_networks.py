"""`removal.leave_networks`, against a stand-in engine: which containers leave which networks
(on each network two or more are on, all but the last), in what order, and what is left
alone (a remote or Podman engine, a container not running, the networks a mode puts it on,
a spent deadline); a failure never stops the removal."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from orchestrator.backends.container import removal
from orchestrator.errors import DockerError


class StandIn:
    def __init__(self, kind: str = "docker", socket: str | None = "/run/docker.sock") -> None:
        self.kind, self.socket = kind, socket
        self.left: list[tuple[str, str]] = []
        self.fail = False

    def leave(self, network: str, container: str, *, action: str, seconds: float) -> None:
        assert seconds >= 1.0 and action
        self.left.append((container, network))
        if self.fail:
            raise DockerError("the engine refused")


def _container(ident: str, state: str = "running", **networks: str) -> dict[str, Any]:
    joined = {name: {"NetworkID": nid} for name, nid in networks.items()}
    return {"Id": ident, "State": state, "NetworkSettings": {"Networks": joined}}


def test_each_running_container_leaves_each_of_its_networks_in_turn() -> None:
    engine = StandIn()
    containers = [
        _container("main", default="n1"),
        _container("gateway", default="n1", egress="n2"),
        _container("stopped", state="exited", default="n1"),
        _container("lone", none="n0"),
        _container("hosted", host="nh"),
    ]
    removal.leave_networks(engine, containers, "removing")  # type: ignore[arg-type]
    assert engine.left == [("main", "n1")]  # the gateway ends alone on both


def test_all_but_one_leave_each_network_one_container_after_another() -> None:
    engine = StandIn()
    containers = [
        _container("a", default="n1", egress="n2"),
        _container("b", default="n1", egress="n2", third="n3"),
        _container("c", default="n1", third="n3"),
    ]
    removal.leave_networks(engine, containers, "removing")  # type: ignore[arg-type]
    assert engine.left == [("a", "n1"), ("a", "n2"), ("b", "n1"), ("b", "n3")]


@pytest.mark.parametrize(("kind", "socket"), [("podman", "/run/podman.sock"), ("docker", None)])
def test_an_engine_without_the_deadlock_or_a_local_socket_is_left_alone(
    kind: str, socket: str | None
) -> None:
    engine = StandIn(kind, socket)
    two = [_container("main", default="n1"), _container("side", default="n1")]
    removal.leave_networks(engine, two, "removing")  # type: ignore[arg-type]
    assert engine.left == []


def test_a_failure_is_logged_and_the_others_still_leave(caplog: pytest.LogCaptureFixture) -> None:
    engine = StandIn()
    engine.fail = True
    containers = [_container("a", default="n1", egress="n2"), _container("b", n1="n1", n2="n2")]
    with caplog.at_level(logging.INFO, logger=removal.log.name):
        removal.leave_networks(engine, containers, "removing")  # type: ignore[arg-type]
    assert engine.left == [("a", "n1"), ("a", "n2")]
    assert "did not leave a network first" in caplog.text


def test_past_its_deadline_nothing_more_is_asked() -> None:
    engine = StandIn()
    two = [_container("a", default="n1"), _container("b", default="n1")]
    removal.leave_networks(engine, two, "removing", seconds=0)  # type: ignore[arg-type]
    assert engine.left == []


@pytest.mark.parametrize(
    "odd",
    [
        {"Id": "a", "State": "running"},
        {"Id": "a", "State": "running", "NetworkSettings": None},
        {"Id": "a", "State": "running", "NetworkSettings": {"Networks": ["n"]}},
        {"Id": "a", "State": "exited", "NetworkSettings": {"Networks": {"d": {"NetworkID": "n"}}}},
        {
            "Id": "a",
            "State": "running",
            "NetworkSettings": {"Networks": {"host": {"NetworkID": "n"}}},
        },
        {"Id": "a", "State": "running", "NetworkSettings": {"Networks": {"default": None}}},
        {"Id": "", "State": "running", "NetworkSettings": {"Networks": {"d": {"NetworkID": "n"}}}},
    ],
)
def test_an_answer_of_another_shape_is_skipped(odd: dict[str, Any]) -> None:
    engine = StandIn()
    with_it = [odd, _container("b", d="n")]  # (counted, it would make b leave n)
    removal.leave_networks(engine, with_it, "removing")  # type: ignore[arg-type]
    assert engine.left == []


def test_a_paused_container_leaves_too() -> None:
    """One paused by another process (`orchestrator pause`) goes with the rest."""
    engine = StandIn()
    containers = [_container("a", state="paused", d="n1"), _container("b", d="n1")]
    removal.leave_networks(engine, containers, "removing")  # type: ignore[arg-type]
    assert engine.left == [("a", "n1")]
