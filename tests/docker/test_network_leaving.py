"""Containers of one project leave their networks one at a time before they go down together
(removal.leave_networks): this engine (Docker 20.10) can deadlock when two endpoints of one
network go at once, and then hangs every network call until it is restarted. What the
engine itself reports is checked: its events say each endpoint went before any container of
the project died, so no two went as their containers exited together."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import Runtime, load_environment, spawn_runtime
from orchestrator.backends.container.inventory import remove_by_label
from tests.conftest import PYTHON_IMAGE, labelled_ids
from tests.docker.conftest import engine_events


def _name(rt: Runtime) -> str:
    project = getattr(rt, "project", None)
    assert project is not None
    return str(project.name)


def _joined(rt: Runtime | str) -> dict[str, set[str]]:
    """Each container of the project: the ids of the networks it is on."""
    name = rt if isinstance(rt, str) else _name(rt)
    out = subprocess.run(
        [
            "docker",
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            f"label=com.docker.compose.project={name}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    fmt = "{{.Id}}{{range .NetworkSettings.Networks}} {{.NetworkID}}{{end}}"
    lines = subprocess.run(
        ["docker", "inspect", "-f", fmt, *out], capture_output=True, text=True, timeout=60
    ).stdout.splitlines()
    return {line.split()[0]: set(line.split()[1:]) for line in lines if line.strip()}


def _order(events: list[dict[str, object]], ids: set[str]) -> list[tuple[str, str, str]]:
    """What happened to the project's containers, in order: ("leave", container, network)
    for each endpoint that went, ("die", container, "") for each container that ended."""
    out = []
    for e in events:
        actor = e.get("Actor") or {}
        assert isinstance(actor, dict)
        attributes = actor.get("Attributes") or {}
        assert isinstance(attributes, dict)
        if e.get("Type") == "network" and e.get("Action") == "disconnect":
            container = str(attributes.get("container", ""))
            if container in ids:
                out.append(("leave", container, str(actor.get("ID", ""))))
        elif (e.get("Type"), e.get("Action")) == ("container", "die") and actor.get("ID") in ids:
            out.append(("die", str(actor.get("ID", "")), ""))
    return out


FILE = (
    f"version: 1\nname: leaving\nimage: {PYTHON_IMAGE}\n"
    "network: {egress: [allowed.test]}\n"
    f"services:\n  side: {{image: {PYTHON_IMAGE}, command: [sleep, '3600']}}\n"
)


def _ending(rt: Runtime) -> dict[str, Callable[[], object]]:
    return {
        "cleanup": rt.cleanup,
        "kill": rt.kill,
        "reap": lambda: remove_by_label(_name(rt)),
    }


@pytest.mark.parametrize("how", ["cleanup", "kill", "reap"])
def test_no_two_endpoints_of_one_network_go_as_a_projects_containers_end(
    tmp_path: Path, how: str
) -> None:
    """A `down` through the API, a kill (suspend's) and the reaper's removal by label: on
    each network, all of the project's containers but one left it before any ended."""
    path = tmp_path / "env.yaml"
    path.write_text(FILE)
    before = labelled_ids()
    rt = spawn_runtime(load_environment(path))
    try:
        joined = _joined(rt)
        assert len(joined) == 3, joined  # main, its service, the egress gateway
        assert sorted(len(n) for n in joined.values()) == [1, 1, 2], joined  # (the way out)
        with engine_events("die", "disconnect", settled=list(joined)) as events:
            _ending(rt)[how]()
        order = _order(events, set(joined))
        left_first: dict[str, set[str]] = {}  # container -> the networks it left before it ended
        for ident, networks in joined.items():
            mine = [(kind, network) for kind, who, network in order if who == ident]
            assert [kind for kind, _ in mine].count("die") == 1, order
            assert {network for kind, network in mine if kind == "leave"} == networks, order
            died = [kind for kind, _ in mine].index("die")
            left_first[ident] = {network for kind, network in mine[:died] if kind == "leave"}
        for network in set().union(*joined.values()):
            on_it = [ident for ident, networks in joined.items() if network in networks]
            at_end = [ident for ident in on_it if network not in left_first[ident]]
            assert len(at_end) <= 1, (network, order)
        assert any(left_first.values()), order  # (the shared network: left first)
    finally:
        rt.cleanup()
    assert labelled_ids() <= before


def test_a_project_kept_after_cleanup_stops_one_container_at_a_time(tmp_path: Path) -> None:
    """`keep_after_cleanup` stops the containers on their networks (to be started again):
    each one's endpoints go as it stops, before the next one stops."""
    path = tmp_path / "env.yaml"
    path.write_text(FILE + "keep_after_cleanup: true\n")
    before = labelled_ids()
    rt = spawn_runtime(load_environment(path))
    name = _name(rt)
    try:
        joined = _joined(rt)
        assert len(joined) == 3, joined
        with engine_events("die", "disconnect", settled=list(joined)) as events:
            rt.cleanup()
        order = _order(events, set(joined))
        dies = [i for i, (kind, _, _) in enumerate(order) if kind == "die"]
        assert len(dies) == 3, order
        for n, i in enumerate(dies):  # its endpoints went before the next container ended
            ident, end = order[i][1], (dies[n + 1] if n + 1 < len(dies) else len(order))
            left = {net for _, who, net in order[i:end] if who == ident} - {""}
            assert left == joined[ident], order
            assert {who for _, who, _ in order[i:end]} == {ident}, order
    finally:
        remove_by_label(name)
    assert labelled_ids() <= before
