"""ATTACK TESTS (second hostile review of the fixes for issue 20): each test here is a
confirmed hole and FAILS while it is open. Do not mark them xfail: the lead fixes, then
they pass.

- test_attack_remove_environment_ambiguous_across_backends: `remove_environment(ref)` /
  `orchestrator down REF` asks each backend in turn and removes the first match; a ref
  that matches one environment in each of two backends is never called ambiguous, so
  whichever backend sorts first loses its environment (`match_id`'s rule: "`down
  orch-web` must not take down whatever happens to start so").
- test_attack_container_ambiguity_is_swallowed_then_another_backend_removes: the container
  hook turns "matches several" into "none of mine" (it catches ProjectNotFound), so the
  next backend's single match is removed instead of the caller being told to say more.
- test_attack_one_backend_failing_blinds_the_inventory: one backend whose hook raises
  (its engine is away) makes environments()/reap() fail for every backend: `orchestrator
  ps` and `cleanup` show and reap nothing of the others (an import failure is skipped
  with a warning; a failing hook is not).
- test_attack_render_out_that_is_itself_a_planted_link: `render --out ws/project` where a
  sandbox left `project` as a link: `out` itself (and its parents) is still followed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest

import orchestrator
from orchestrator import EnvironmentStatus, ProjectNotFound
from orchestrator.backends.local import LocalRuntime
from orchestrator.errors import DockerError
from orchestrator.sandbox import registry
from orchestrator.sandbox.record import match_id

REMOVED: list[str] = []


def _row(ident: str) -> EnvironmentStatus:
    return EnvironmentStatus(ident, "web", "detached", "running", 1, 0, ())


def _backend(ident: str) -> type[LocalRuntime]:
    """A plugin backend whose environments outlive their process: it holds `ident` and
    matches refs the way the container inventory does (`match_id`)."""

    class Plugin(LocalRuntime):
        @classmethod
        def running(cls, *, usage: bool = False) -> tuple[list[EnvironmentStatus], list[str]]:
            return [_row(ident)], []

        @classmethod
        def remove_running(cls, ref: str, *, force: bool = False) -> str | None:
            try:
                name = match_id(ref, [ident], prefix="orch-")
            except ProjectNotFound:
                return None
            REMOVED.append(name)
            return name

        @classmethod
        def reap(cls, *, everything: bool = False, include_kept: bool = False) -> list[str]:
            return []

    return Plugin


Make = Callable[..., None]


@pytest.fixture
def registry_of(monkeypatch: pytest.MonkeyPatch) -> Make:
    def make(backends: dict[str, type], builtin: dict[str, str] | None = None) -> None:
        monkeypatch.setattr(registry, "_registered", {})
        monkeypatch.setattr(registry, "_BUILTIN", builtin or {})
        monkeypatch.setattr(registry, "_entry_points", dict)
        for name, cls in backends.items():
            registry.register_runtime(name)(cls)
        REMOVED.clear()

    return make


def test_attack_remove_environment_ambiguous_across_backends(registry_of: Make) -> None:
    """ATTACK (another harness's environment taken down by an ambiguous ref)."""
    registry_of({"aaa": _backend("orch-web-0000000a"), "bbb": _backend("orch-web-0000000b")})
    rows, _ = orchestrator.environments()
    assert [r.id for r in rows] == ["orch-web-0000000a", "orch-web-0000000b"]
    # within one backend this ref is refused ("matches several"); across two it is not
    with pytest.raises(ProjectNotFound, match="several"):
        match_id("orch-web", [r.id for r in rows], prefix="orch-")
    with contextlib.suppress(ProjectNotFound):
        orchestrator.remove_environment("orch-web", force=True)
    assert not REMOVED, (
        f"`down orch-web` matched two environments of two backends and removed {REMOVED} "
        "without calling the ref ambiguous"
    )


def test_attack_container_ambiguity_is_swallowed_then_another_backend_removes(
    registry_of: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ATTACK: two docker environments match `orch-web`: the container hook says "none of
    mine", and a plugin backend's one `orch-web-...` is removed instead."""
    from orchestrator.backends.container import inventory as cinv

    names = ["orch-web-11111111", "orch-web-22222222"]
    projects = [cinv.ProjectInfo(n, {}, [], []) for n in names]
    monkeypatch.setattr(cinv, "list_projects", lambda client=None: projects)
    removed_docker: list[str] = []
    monkeypatch.setattr(
        cinv, "remove_project", lambda info, client=None: removed_docker.append(info.name)
    )
    registry_of(
        {"zz-plugin": _backend("orch-web-0000000f")},
        builtin={"docker": "orchestrator.backends.docker.runtime:ComposeRuntime"},
    )
    outcome = "nothing"
    try:
        outcome = f"removed {orchestrator.remove_environment('orch-web', force=True)}"
    except ProjectNotFound as exc:
        outcome = f"refused: {exc}"
    assert not REMOVED and not removed_docker, (
        f"ref 'orch-web' matches {names} on docker (ambiguous there), yet {outcome}"
    )
    assert "several" in outcome, f"the caller is not told the ref is ambiguous: {outcome}"


def test_attack_one_backend_failing_blinds_the_inventory(registry_of: Make) -> None:
    """ATTACK (availability): a plugin whose engine is away hides every other backend's
    environments from ps and stops cleanup reaping them."""

    class Away(LocalRuntime):
        @classmethod
        def running(cls, *, usage: bool = False) -> tuple[list[EnvironmentStatus], list[str]]:
            raise DockerError("cannot reach its engine")

        @classmethod
        def reap(cls, *, everything: bool = False, include_kept: bool = False) -> list[str]:
            raise DockerError("cannot reach its engine")

    registry_of({"aaa-away": Away, "bbb": _backend("orch-web-0000000b")})
    try:
        rows, _ = orchestrator.environments()
        listed = [r.id for r in rows]
    except DockerError as exc:
        listed = [f"raised: {exc}"]
    assert listed == ["orch-web-0000000b"], (
        f"one backend's failing hook hid the others' environments from ps: {listed}"
    )


def test_attack_render_out_that_is_itself_a_planted_link(tmp_path: Path) -> None:
    """ATTACK (hostile sandbox, the render fix's own case one level up): the caller renders
    into a folder of a workspace a sandbox wrote (`render --out ws/project`), and the sandbox
    left `project` as a link. `_write_below` opens every folder *below* `out` without
    following links, but `out` itself (and its parents) with it: the project's compose.yaml
    and sandbox/ land in the link's target, e.g. a folder where the user runs compose."""
    import subprocess
    import sys

    spec = tmp_path / "env.yaml"
    spec.write_text(
        "version: 1\nname: r\nimage: orchestrator-test/busybox:1\n"
        'env:\n  PAYLOAD: "from the file"\n'
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "compose.yaml").write_text("original\n")
    (ws / "project").symlink_to(victim)  # left by the sandbox that wrote ws
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "render",
            str(spec),
            "-w",
            str(ws),
            "--out",
            str(ws / "project"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    written = sorted(p.name for p in victim.iterdir())
    changed = (victim / "compose.yaml").read_text() != "original\n"
    assert not changed and written == ["compose.yaml"], (
        f"render --out {ws / 'project'} (a link) wrote into {victim}: {written} "
        f"(rc {done.returncode}: {done.stderr.strip()[-200:]})"
    )
