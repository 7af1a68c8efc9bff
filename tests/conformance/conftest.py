"""The conformance suite runs against every registered backend. `docker-plain` is the Docker
backend with the fast executor switched off, so the fallback path keeps the same rules."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import Runtime, load_environment, spawn_runtime
from orchestrator.runtime.registry import get_runtime_class, runtime_names
from tests.conftest import PYTHON_IMAGE, docker_problem

BACKENDS = [*runtime_names(), "docker-plain"]
NON_ROOT = "1000:1000"


def env_text(backend: str) -> str:
    kind = "local" if backend == "local" else "docker"
    lines = [
        "version: 1",
        f"name: conf-{backend}",
        f"backend: {kind}",
        "env: {FILE_VAR: from-file, OVERRIDE: file}",
        "env_passthrough: [ORCH_PASS]",
        "static_assets:",
        "  - {name: data, path: assets, save_path: data}",
        "setup:",
        "  commands: ['echo setup-marker', 'echo ran >> .setup-count']",
        "  eval_commands: ['echo eval >> .eval-count']",
    ]
    if kind == "docker":
        lines += [
            f"image: {PYTHON_IMAGE}",
            f"user: '{NON_ROOT}'",
            "resources: {memory: 1g, pids: 512}",
        ]
    return "\n".join(lines) + "\n"


def write_env(folder: Path, backend: str) -> Path:
    (folder / "assets").mkdir(parents=True, exist_ok=True)
    (folder / "assets" / "hello.txt").write_text("static hello\n")
    path = folder / "env.yaml"
    path.write_text(env_text(backend))
    return path


def deviation(backend: str, rule: str) -> str | None:
    """The documented reason a backend does not keep `rule`, if it does not."""
    name = "docker" if backend.startswith("docker") else backend
    return get_runtime_class(name).deviations.get(rule)


def spawn(backend: str, folder: Path, **kwargs: object) -> Runtime:
    if backend.startswith("docker") and docker_problem():
        pytest.skip(docker_problem() or "")
    path = write_env(folder, backend)
    mode = "plain" if backend == "docker-plain" else "auto"
    old = os.environ.get("ORCHESTRATOR_EXEC_MODE")
    os.environ["ORCHESTRATOR_EXEC_MODE"] = mode
    os.environ["ORCH_PASS"] = "passed"
    os.environ["ORCH_NOPASS"] = "hidden"
    try:
        return spawn_runtime(
            load_environment(path), env_vars={"OVERRIDE": "spawn", "SPAWN_VAR": "1"}, **kwargs
        )
    finally:
        if old is None:
            os.environ.pop("ORCHESTRATOR_EXEC_MODE", None)
        else:
            os.environ["ORCHESTRATOR_EXEC_MODE"] = old


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def rt(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """One runtime per backend, shared by the module's read-mostly checks."""
    with spawn(backend, tmp_path_factory.mktemp(f"env-{backend}")) as runtime:
        yield runtime


@pytest.fixture
def fresh(backend: str, tmp_path: Path) -> Iterator[Runtime]:
    """A runtime of its own, for checks that kill or close it."""
    runtime = spawn(backend, tmp_path)
    try:
        yield runtime
    finally:
        runtime.cleanup()
