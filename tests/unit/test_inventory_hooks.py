"""`orchestrator.environments`, `remove_environment` and `reap` ask every backend through its
class hooks, each distinct implementation once, and name no backend."""

from __future__ import annotations

from typing import ClassVar

import pytest

import orchestrator
from orchestrator import EnvironmentStatus, ProjectNotFound, UsageError
from orchestrator.backends.local import LocalRuntime
from orchestrator.sandbox import registry
from orchestrator.services import inventory

ASKED: list[str] = []


def _row(ident: str) -> EnvironmentStatus:
    return EnvironmentStatus(ident, "e", "detached", "running", 1, 0, ())


class Kept(LocalRuntime):
    """A backend whose environments outlive their process: it answers for 'orch-kept-1'."""

    @classmethod
    def running(cls, *, usage: bool = False) -> tuple[list[EnvironmentStatus], list[str]]:
        ASKED.append(f"running {cls.__name__}")
        return [_row("orch-kept-1")], ["orch-gone-1"]

    @classmethod
    def running_ids(cls) -> list[str]:
        return ["orch-kept-00000001"]

    @classmethod
    def remove_running(cls, ident: str, *, force: bool = False) -> str | None:
        ASKED.append(f"remove {cls.__name__} {ident}")
        if not force:
            raise UsageError("its owner still uses it")
        return ident

    @classmethod
    def reap(cls, *, everything: bool = False, include_kept: bool = False) -> list[str]:
        ASKED.append(f"reap {cls.__name__} {everything} {include_kept}")
        return ["orch-gone-1"]


class KeptToo(Kept):
    """Another name over the same implementation (as docker and swarm share theirs)."""

    name: ClassVar[str] = "kept-too"


@pytest.fixture
def only_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_registered", {"local": LocalRuntime})
    monkeypatch.setattr(registry, "_BUILTIN", {})
    monkeypatch.setattr(registry, "_entry_points", dict)
    registry.register_runtime("kept")(Kept)
    registry.register_runtime("kept-too")(KeptToo)
    ASKED.clear()


@pytest.mark.usefixtures("only_ours")
def test_every_backend_is_asked_once_per_implementation() -> None:
    rows, removed = orchestrator.environments()
    assert [r.id for r in rows] == ["orch-kept-1"] and removed == ["orch-gone-1"]
    assert ASKED == ["running Kept"]  # not KeptToo (same hooks), not local (nothing outlives)
    assert orchestrator.reap(everything=True) == ["orch-gone-1"]
    assert ASKED[-1] == "reap Kept True False"


@pytest.mark.usefixtures("only_ours")
def test_remove_by_id_keeps_the_owners_word_and_names_an_unknown_id() -> None:
    with pytest.raises(UsageError, match="owner still uses it"):
        orchestrator.remove_environment("orch-kept")  # the environment's whole name
    assert orchestrator.remove_environment("00000001", force=True) == "orch-kept-00000001"
    assert ASKED[-1] == "remove Kept orch-kept-00000001"  # the backend gets the exact id
    with pytest.raises(ProjectNotFound, match="orch-kept-00000001"):
        orchestrator.remove_environment("orch-nosuch-00000000")  # names the ones there are


def test_a_backend_that_cannot_be_imported_is_skipped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(registry, "_registered", {})
    monkeypatch.setattr(registry, "_BUILTIN", {"broken": "no_such_module_here:Runtime"})
    monkeypatch.setattr(registry, "_entry_points", dict)
    assert orchestrator.environments() == ([], [])
    assert "backend 'broken' skipped" in caplog.text


def test_removing_by_exact_id_never_takes_another_by_a_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`top`'s d-y removes the id it showed: when that one is gone meanwhile, another whose
    id it prefixes is not taken in its place."""
    from orchestrator.services import inventory

    removed: list[str] = []

    class Two(LocalRuntime):
        @classmethod
        def running_ids(cls) -> list[str]:
            return ["orch-a-1234-z-5678"]

        @classmethod
        def remove_running(cls, ident: str, *, force: bool = False) -> str | None:
            removed.append(ident)
            return ident

    monkeypatch.setattr(inventory, "_backends", lambda: [inventory.Keeper("two", Two)])
    with pytest.raises(ProjectNotFound, match="gone already"):
        inventory.remove_environment("orch-a-1234", exact=True)
    assert removed == []
    assert inventory.remove_environment("orch-a-1234") == "orch-a-1234-z-5678"  # (a prefix)


def test_a_listing_that_left_a_backend_out_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`ps` once printed the local backend's environments alone, exit 0, when the container
    backends' listing failed (logged as "skipped" only): a harness saw its environment
    missing. The others' are still listed; a caller that asks is told which backend was
    left out, and `ps` exits 1 saying so. One that cannot run here (no engine) is no
    failure: a machine without Docker lists its local environments, exit 0."""
    from typer.testing import CliRunner

    from orchestrator.cli import app
    from orchestrator.errors import BackendUnavailable, DockerError

    failure: list[Exception] = []

    class Failing(LocalRuntime):
        @classmethod
        def running(cls, *, usage: bool = False) -> tuple[list[EnvironmentStatus], list[str]]:
            raise failure[0]

    monkeypatch.setattr(
        inventory,
        "_backends",
        lambda: [inventory.Keeper("kept", Kept), inventory.Keeper("local", Failing)],
    )
    failure.append(DockerError("listing (ps) timed out"))
    failures: list[str] = []
    rows, _ = orchestrator.environments(failures=failures)
    assert [r.id for r in rows] == ["orch-kept-1"]
    assert failures == ["the local backend's environments are not listed: listing (ps) timed out"]
    shown = CliRunner().invoke(app, ["ps", "--json"])
    assert shown.exit_code == 1 and "orch-kept-1" in shown.stdout
    assert "not listed: listing (ps) timed out" in shown.stderr
    failure[0] = BackendUnavailable("the Docker engine is not reachable")
    failures.clear()
    rows, _ = orchestrator.environments(failures=failures)
    assert [r.id for r in rows] == ["orch-kept-1"] and failures == []
    assert CliRunner().invoke(app, ["ps"]).exit_code == 0
    assert "backend 'local' skipped" in caplog.text


def test_projects_on_an_engine_that_did_not_answer_are_said_to_be_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An environment `up --engine podman` (or `-H`) started lives on another engine; when
    that engine does not answer, `ps` listed the rest and exited 0 as if it were whole."""
    from typer.testing import CliRunner

    from orchestrator.backends.container import inventory as container_inventory
    from orchestrator.backends.container.runtime import ContainerRuntime
    from orchestrator.cli import app
    from orchestrator.errors import PartialListing

    monkeypatch.setattr(container_inventory, "list_projects", lambda *a, **k: [])
    monkeypatch.setattr(container_inventory, "reap", lambda *a, **k: [])
    monkeypatch.setattr(
        container_inventory, "elsewhere", lambda: {"orch-far-00000001": "unix:///nowhere.sock"}
    )
    monkeypatch.setattr(container_inventory, "listing_elsewhere", lambda host: None)
    with pytest.raises(PartialListing, match=r"nowhere\.sock did not answer: orch-far-00000001"):
        container_inventory.running_environments()
    monkeypatch.setattr(
        inventory,
        "_backends",
        lambda: [inventory.Keeper("kept", Kept), inventory.Keeper("docker", ContainerRuntime)],
    )
    failures: list[str] = []
    rows, _ = orchestrator.environments(failures=failures)
    assert [r.id for r in rows] == ["orch-kept-1"]
    assert len(failures) == 1 and "orch-far-00000001" in failures[0]
    shown = CliRunner().invoke(app, ["ps"])
    assert shown.exit_code == 1 and "orch-kept-1" in shown.stdout
    assert "did not answer: orch-far-00000001" in shown.stderr


def test_built_in_backends_are_asked_through_the_hooks_their_classes_have(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A listing asks the built-in backends through the classes KEEPERS names, without
    loading the backends (`orchestrator ps` loads no pydantic): each must be the one whose
    hooks the backend's own class has."""
    import importlib

    from orchestrator.sandbox.keeping import Keeping

    assert set(inventory.KEEPERS) == set(registry._BUILTIN.values())
    for target, keeper in inventory.KEEPERS.items():
        module, _, name = target.partition(":")
        cls = getattr(importlib.import_module(module), name)
        if keeper is None:
            assert inventory._hooks(cls) == inventory._hooks(Keeping), target
        else:
            where, _, attr = keeper.partition(":")
            hooks = getattr(importlib.import_module(f"orchestrator.backends.{where}"), attr)
            assert inventory._hooks(cls) == inventory._hooks(hooks) != inventory._hooks(Keeping)
    monkeypatch.setattr(registry, "_registered", {})  # (as in a new process: none loaded)
    monkeypatch.setattr(registry, "_entry_points", dict)
    assert [(k.name, k.hooks.__name__) for k in inventory._backends()] == [
        ("docker", "ContainerInventory")
    ]
