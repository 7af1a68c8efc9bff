"""One room per backend (issue 20): Compose and Swarm are siblings over ContainerRuntime, one
class spells `docker exec`, the pool and snapshots use public hooks of the runtime class, and
no room imports another's."""

from __future__ import annotations

import ast
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import orchestrator
from orchestrator import Pool, load_environment_text
from orchestrator.backends.docker.runtime import ComposeRuntime
from orchestrator.backends.local import LocalRuntime
from orchestrator.backends.swarm.runtime import SwarmRuntime
from orchestrator.sandbox.registry import register_runtime
from orchestrator.sandbox.snapshot import Snapshot

if TYPE_CHECKING:
    from orchestrator.sandbox.base import PoolState

# the new names are imported inside the tests, so that each fails on its own on the old tree
PACKAGE = Path(orchestrator.__file__).resolve().parent


def _modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


# ----- 1. siblings, not a child that undoes its parent -----------------------------------------
def test_compose_and_swarm_are_siblings_over_container_runtime() -> None:
    from orchestrator.backends.container.runtime import ContainerRuntime

    assert ComposeRuntime.__bases__ == (ContainerRuntime,)
    assert SwarmRuntime.__bases__ == (ContainerRuntime,)
    assert not issubclass(SwarmRuntime, ComposeRuntime)


def test_no_backend_method_calls_past_its_parent() -> None:
    """`Runtime.detach(self)` in a subclass skips whatever lies between: never."""
    skips = []
    for path in _modules("backends"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id.endswith(("Runtime", "Sandbox"))
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "self"
            ):
                skips.append(f"{path.name}:{node.lineno}")
    assert skips == []


# ----- 2. only the Engine spells engine argv or API paths ---------------------------------------
ENGINE = PACKAGE / "backends" / "container" / "engine"
IN_CONTAINER = {"agent.py", "spawner.py", "spawnchild.py", "wire.py", "__init__.py"}
"""The executor's own code under executor/ runs inside the sandbox: its argv is not the
engine's."""
ENGINES = frozenset({"docker", "podman", "timeout"})
VERBS = frozenset(
    {"exec", "inspect", "ps", "rm", "pause", "unpause", "commit", "logs", "network", "volume"}
    | {"image", "stack", "service", "node", "info", "version", "compose", "context", "cp"}
    | {"--host", "--format", "--filter"}
)
"""Words of a docker command line (`build` is left out: the Compose mapper's paths of keys
hold it)."""
API_PATHS = ("/containers", "/networks", "/volumes", "/images", "/commit", "/version", "/v4")


def _outside_the_engine() -> list[Path]:
    """Every module of the package but the engine's own; the executor's in-container code;
    and the conformance kit (testing/), which builds its test world from public names only
    and so runs its own docker commands: it is the tester, not the tested."""
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if ENGINE not in path.parents
        and not (path.parent.name == "executor" and path.name in IN_CONTAINER)
        and PACKAGE / "testing" not in path.parents
    ]


def _spelled(tree: ast.AST) -> list[int]:
    """Lines of a docker command line spelled by hand: a list or tuple that starts with the
    engine's program and holds one of its words, or a prefix (`[*docker, "rm", ...]`) and
    such a word; and of an Engine API path."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple) and node.elts:
            first = node.elts[0]
            words = {e.value for e in node.elts if isinstance(e, ast.Constant)}
            program = isinstance(first, ast.Constant) and first.value in ENGINES and len(words) > 2
            prefixed = isinstance(first, ast.Starred)
            if (program or prefixed) and words & VERBS:
                found.append(node.lineno)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith(API_PATHS)
        ):
            found.append(node.lineno)
    return found


def test_only_the_engine_spells_engine_argv_or_api_paths() -> None:
    spelled = {
        str(path.relative_to(PACKAGE)): lines
        for path in _outside_the_engine()
        if (lines := _spelled(ast.parse(path.read_text())))
    }
    assert spelled == {}


def test_the_rule_sees_a_hand_spelled_command_line() -> None:
    """The checker itself can fail: the shapes the engine's callers used to write are seen."""
    shapes = [
        '["docker", "exec", "c", "true"]',
        '[*docker_cmd, "rm", "--force", *ids]',
        '("timeout", "-k", "5", "9", "podman", "ps")',
        '[*self._docker_cmd, "exec"]',
        'call(sock, "GET", f"/containers/{c}/json")',
    ]
    assert all(_spelled(ast.parse(shape)) for shape in shapes)
    innocent = ['name in ("run", "exec")', '("docker", "podman")', '("docker", "network")']
    assert not any(_spelled(ast.parse(shape)) for shape in innocent)


def test_no_module_takes_an_argv_prefix() -> None:
    """`docker_cmd` (a `timeout ... docker [--host H]` prefix carried through the backends)
    is gone: every backend and service takes an Engine."""
    named = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if "docker_cmd" in path.read_text() or "raw_cmd" in path.read_text()
    ]
    assert named == []


def test_no_value_a_caller_gives_can_pass_for_a_docker_option() -> None:
    """A user, a folder or a variable that starts with `-` stays the value of its option."""
    from orchestrator.backends.container.engine import Engine

    argv = (
        Engine.at("unix:///x")
        .exec_target("c1")
        .argv(
            ["sh", "-c", "echo hi"],
            user="--privileged",
            workdir="-w/etc",
            env={"A": "--env=B=1", "PATH": "/x"},
            stdin=True,
        )
    )
    assert argv == [
        "docker",
        "--host",
        "unix:///x",
        "exec",
        "-i",
        "--user=--privileged",
        "--workdir=-w/etc",
        "--env=A=--env=B=1",
        "--env=PATH=/x",
        "c1",
        "sh",
        "-c",
        "echo hi",
    ]
    with pytest.raises(ValueError):
        Engine.at("unix:///x").exec_target("--privileged").argv(["true"])
    with pytest.raises(ValueError):
        Engine.at("unix:///x").exec_target("c1").argv([])


# ----- 3. engine text is read in one module ----
def _engine_text_tests(tree: ast.AST) -> list[int]:
    """Lines testing a substring of some `.stderr` (`"x" in exc.stderr`), or searching engine
    words with a pattern (`PATTERN.search(said)`) outside the engine."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
        and any(isinstance(c, ast.Attribute) and c.attr == "stderr" for c in node.comparators)
    ]


def test_no_module_but_the_engine_ones_reads_engine_text() -> None:
    found = {
        str(path.relative_to(PACKAGE)): lines
        for path in _outside_the_engine()
        if (lines := _engine_text_tests(ast.parse(path.read_text())))
    }
    assert found == {}


# ----- 4. public hooks ---------------------------------------------------------------------
def test_the_pool_and_snapshots_import_no_backend_and_call_no_private_hook() -> None:
    for name in ("services/pool.py", "sandbox/snapshot.py"):
        path = PACKAGE / name
        assert not [m for m in _imports(path) if m.startswith("orchestrator.backends")], name
    private = [
        f"pool.py:{node.lineno} {node.attr}"
        for node in ast.walk(ast.parse((PACKAGE / "services" / "pool.py").read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]
    assert private == []


class _Hooked(LocalRuntime):
    """A local runtime keeping pool state as a container backend does in its folder; another
    process claiming it is `claimed_by_another()`."""

    resets = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.state: tuple[str, PoolState] | None = None

    def pool_enter(self, pool: str) -> None:
        self.state = (pool, "ready")

    def pool_move(self, frm: PoolState, to: PoolState) -> bool:
        if self.state is None or self.state[1] != frm:
            return False
        self.state = (self.state[0], to)
        return True

    def pool_state(self) -> PoolState | None:
        return self.state[1] if self.state else None

    def detach(self) -> None:
        self.state = None  # the other process's now (the test cleans it up itself)

    def reset(self, baseline: bytes) -> None:
        type(self).resets += 1
        super().reset(baseline)


register_runtime("pool-hooks-test")(_Hooked)
ENV = "version: 1\nname: hooked\nbackend: local\nsetup: {commands: ['echo set > f']}\n"


def _filled(pool: Pool) -> None:
    deadline = time.monotonic() + 20
    while pool.ready < pool.size and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.ready == pool.size


def test_the_pool_asks_the_runtime_for_membership_and_reset() -> None:
    """A member another process claimed (`up --pool`) is never handed out, whatever the
    backend: the pool learns it through the runtime's hooks, not a Docker folder."""
    with Pool(load_environment_text(ENV), size=1, reuse=True, backend="pool-hooks-test") as pool:
        _filled(pool)
        [claimed] = list(pool._ready)
        assert isinstance(claimed, _Hooked) and claimed.state == (pool.id, "ready")
        assert claimed.pool_move("ready", "claimed")  # another process takes it
        assert pool.sweep() == 1
        _filled(pool)
        rt = pool.acquire(timeout=20)
        assert rt is not claimed and isinstance(rt, _Hooked) and rt.pool_state() == "in-use"
        claimed.cleanup()
        rt.execute("echo changed > f; echo new > g")
        pool.release(rt)  # a reuse pool resets it
        assert _Hooked.resets == 1 and not rt.closed
        again = pool.acquire(timeout=20)
        assert again is rt and rt.read_file("f") == "set\n"
        assert rt.execute("test -e g").exit_code == 1
        pool.release(rt)


class _ImageMaker(LocalRuntime):
    removed: list[str] = []

    @classmethod
    def remove_snapshot_image(cls, snap: Snapshot) -> None:
        cls.removed.append(snap.image)


register_runtime("image-maker-test")(_ImageMaker)


def _record(tmp_path: Path, **extra: str) -> Snapshot:
    path = tmp_path / "s.tar"
    path.write_bytes(b"")
    record = {"env": "e", "digest": "d", "created": "now", "size": 0, **extra}
    path.with_suffix(".json").write_text(json.dumps(record))
    return Snapshot.find(path)


def test_a_snapshot_image_goes_through_the_class_of_the_backend_that_made_it(
    tmp_path: Path,
) -> None:
    snap = _record(tmp_path, image="img:1", backend="image-maker-test")
    snap.remove()
    assert _ImageMaker.removed == ["img:1"] and not snap.path.exists()


def test_a_record_naming_no_registered_backend_touches_no_image(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A record is a file: one naming an import path as its backend imports nothing."""
    snap = _record(tmp_path, image="orchestrator-test/busybox:1", backend="os:system")
    with caplog.at_level(logging.WARNING):
        snap.remove()
    assert "left alone" in caplog.text and not snap.record.exists()


# ----- 5. rooms ----------------------------------------------------------------------------
