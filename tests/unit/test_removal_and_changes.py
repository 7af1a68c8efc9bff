"""What a removal through the API and a change of egress do when the engine fails them
midway, with stand-ins for the engine (no Docker): a removal falls back to removing by
label whatever the failure was, and a narrowing that failed still cuts what was open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.docker import egress_change, lifecycle
from orchestrator.backends.docker.compiled import CompiledProject
from orchestrator.backends.docker.network import GATEWAY
from orchestrator.errors import DockerError, OrchestratorError
from orchestrator.spec.egress import parse


def _compiled(**more: Any) -> CompiledProject:
    return CompiledProject("orch-x-1", "", {}, (), (), {}, "0:0", "bridge", True, False, **more)


class FakeEngine:
    """Records what is asked; `fail` names the call that raises, and with what."""

    socket = "/nonexistent.sock"
    kind = "docker"
    bound = 5.0

    def __init__(self, fail: dict[str, Exception]) -> None:
        self.fail, self.asked = fail, list[str]()

    def __getattr__(self, name: str) -> Any:
        def call(*args: object, **kwargs: object) -> object:
            self.asked.append(name)
            if name in self.fail:
                raise self.fail[name]
            return {"containers": [{"Id": "c1", "Labels": "odd"}], "networks": [], "volumes": []}

        return call

    def within(self, seconds: float) -> FakeEngine:
        return self


def test_a_removal_that_fails_in_any_way_is_finished_by_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No thread to be had, or an answer of an odd shape, raised past the fallback: the
    project's containers kept running while its owner lived."""
    (tmp_path / "compose.yaml").write_text("services: {}\n")
    labelled: list[str] = []
    monkeypatch.setattr(lifecycle, "remove_by_label", lambda name, engine: labelled.append(name))
    for failure in (RuntimeError("can't start new thread"), DockerError("engine said no")):
        labelled.clear()
        project = lifecycle.Project("orch-x-1", tmp_path / "p", _compiled())
        project.directory.mkdir(exist_ok=True)
        (project.directory / "compose.yaml").write_text("services: {}\n")
        project.engine = FakeEngine({"delete_container": failure})  # type: ignore[assignment]
        monkeypatch.setattr(project, "_direct_or_none", lambda: None)
        project.down()
        assert labelled == ["orch-x-1"], failure
        assert not project.directory.exists()


class FakeProject:
    name = "orch-x-1"

    def __init__(self, directory: Path, engine: FakeEngine) -> None:
        self.directory, self.engine = directory, engine
        self.compiled = _compiled(infra=(GATEWAY,), proxied=("main",), egress={"main": "all"})

    def container_of(self, service: str) -> str:
        return f"{self.name}-{service}-1"

    def logs(self, service: str, tail: int) -> str:
        return "(its lines)"

    def wait_gateway(self) -> None:
        self.engine.asked.append("wait_gateway")


@pytest.mark.parametrize("where", ["signal", "exec"])
def test_a_narrowing_that_failed_still_cuts_what_was_open(tmp_path: Path, where: str) -> None:
    """A gateway too busy to answer the probe (or the signal) failed the change before its
    restart: tunnels opened under the wider rules stayed open."""
    (tmp_path / "gateway" / "rules").mkdir(parents=True)
    (tmp_path / "gateway" / "rules" / "rules.conf").write_text("")
    engine = FakeEngine({where: DockerError("timed out", returncode=124)})
    with pytest.raises(OrchestratorError, match="did not confirm its new rules"):
        egress_change.apply(FakeProject(tmp_path, engine), parse(["a.test"]))  # type: ignore[arg-type]
    assert "restart" in engine.asked
    # a widening that failed cuts nothing (nothing it had open is taken away)
    (tmp_path / "gateway" / "egress").write_text("none\n")
    engine = FakeEngine({where: DockerError("timed out", returncode=124)})
    with pytest.raises(OrchestratorError):
        egress_change.apply(FakeProject(tmp_path, engine), parse(["a.test"]))  # type: ignore[arg-type]
    assert "restart" not in engine.asked


def test_a_network_the_engine_still_holds_is_waited_for_and_stale_endpoints_are_let_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full run's teardown failed: the engine said the environment's network "has active
    endpoints" after its last container went, through all five tries in two seconds. Such
    a network is now tried again until REMOVE_WAIT, and an endpoint left without its
    container is disconnected by its name (what a forced disconnect takes)."""
    from orchestrator.backends.container import removal
    from orchestrator.backends.container.engine import NetworkInUse

    class Held:
        """A network the engine holds for the first `holds` removals."""

        def __init__(self, holds: int) -> None:
            self.holds, self.disconnected = holds, list[str]()

        def ids(self, kind: str, *, label: str, action: str) -> list[str]:
            return ["n1"] if kind == "network" and self.holds else []

        def remove_networks(self, ids: list[str], *, action: str) -> None:
            if self.holds:
                self.holds -= 1
                raise NetworkInUse("has active endpoints")

        def joined(self, network: str) -> list[str]:
            return ["orch-x-1-main-1"]  # (what joined() gives for a stale endpoint)

        def disconnect(self, network: str, container: str) -> None:
            self.disconnected.append(container)

    import time

    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # (removal's pauses)
    engine = Held(holds=20)
    assert removal.remove(engine, "orch-x-1", [], ["n1"]) == 1  # type: ignore[arg-type]
    assert engine.holds == 0 and "orch-x-1-main-1" in engine.disconnected
    monkeypatch.setattr(removal, "REMOVE_WAIT", 0.0)
    with pytest.raises(NetworkInUse):  # (a network held for good is still said, in time)
        removal.remove(Held(holds=10**6), "orch-x-1", [], ["n1"])  # type: ignore[arg-type]
