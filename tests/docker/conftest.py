from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Runtime, spawn_runtime
from orchestrator.backends.docker.runtime import ComposeRuntime
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, bounded

MakeEnv = Callable[..., Path]
"""make_env(body, name="t", image=PYTHON_IMAGE) -> the file's path."""


@pytest.fixture
def make_env(tmp_path: Path) -> MakeEnv:
    """Write an environment file from the lines given; return its path."""

    def make(body: str, name: str = "t", image: str = PYTHON_IMAGE) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"version: 1\nname: {name}\nimage: {image}\n{body}")
        return path

    return make


def spawn_in_mode(mode: str, env: Path, **options: Any) -> Runtime:
    """spawn_runtime with ORCHESTRATOR_EXEC_MODE=`mode` (auto, plain) for the spawn alone:
    the runtime reads it when it starts; the process's own value is put back after."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORCHESTRATOR_EXEC_MODE", mode)
        return spawn_runtime(env, **options)


def within(seconds: float, fn: Callable[[], object]) -> object:
    """fn's result; fails (not hangs) if it has not returned within `seconds`; re-raises."""
    outcome, _ = bounded(fn, seconds)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def same_tree(rt: ComposeRuntime, out: Path) -> bool:
    here = sorted(
        f"{p.relative_to(out).as_posix()} {p.stat().st_size}" for p in out.rglob("*") if p.is_file()
    )
    there = rt.execute("cd tree && find . -type f -exec stat -c '%n %s' {} + | cut -c3- | sort")
    return here == there.stdout.splitlines()


__all__ = ["BUSYBOX_IMAGE", "PYTHON_IMAGE", "MakeEnv", "same_tree", "within"]
