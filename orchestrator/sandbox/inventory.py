"""Environments left running, across every backend: list them (`orchestrator ps`), remove
one by id (`down`), remove those whose owner process is gone (`cleanup`). Each backend
answers for its own through the class hooks `Runtime.running`, `remove_running` and `reap`;
backends that share one implementation (the container ones share one inventory) are asked
once. A plugin backend that cannot be imported is skipped with a warning."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

from orchestrator.errors import OrchestratorError, ProjectNotFound
from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.registry import get_runtime_class, runtime_names
from orchestrator.sandbox.results import EnvironmentStatus

T = TypeVar("T")


def _backends() -> list[type[Runtime]]:
    """One class for each distinct implementation of the hooks, in registry order."""
    seen: set[object] = set()
    out = []
    for name in runtime_names():
        try:
            cls = get_runtime_class(name)
        except (ImportError, OrchestratorError) as exc:
            warnings.warn(f"backend {name!r} skipped: {exc}", stacklevel=3)
            continue
        key = (cls.running.__func__, cls.remove_running.__func__, cls.reap.__func__)  # type: ignore[attr-defined]
        if key not in seen:
            seen.add(key)
            out.append(cls)
    return out


def _each(ask: Callable[[type[Runtime]], T]) -> list[T]:
    return [ask(cls) for cls in _backends()]


def environments() -> tuple[list[EnvironmentStatus], list[str]]:
    """Every environment left running, by id; second, the ids of those just removed because
    their owner process is gone."""
    rows: list[EnvironmentStatus] = []
    removed: list[str] = []
    for found, gone in _each(lambda cls: cls.running()):
        rows += found
        removed += gone
    return sorted(rows, key=lambda r: r.id), removed


def remove_environment(ref: str, *, force: bool = False) -> str:
    """Remove the environment `ref` names (its id, last 8 characters or a unique prefix) and
    return its id. UsageError when its owner process still uses it, unless `force`."""
    for cls in _backends():
        name = cls.remove_running(ref, force=force)
        if name is not None:
            return name
    raise ProjectNotFound(f"no environment of ours is named {ref!r}; `orchestrator ps` lists them")


def reap(*, everything: bool = False, include_kept: bool = False) -> list[str]:
    """Remove what is left of environments whose owner process is gone (every one of ours
    with `everything`; those kept on purpose only with `include_kept`): what was removed,
    one line each."""
    return [
        line
        for lines in _each(lambda cls: cls.reap(everything=everything, include_kept=include_kept))
        for line in lines
    ]
