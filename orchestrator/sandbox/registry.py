"""Backend registry: the class of each backend, by name. Built-in backends are named by import
path and imported only when used; third-party backends register with `register_runtime` or
the entry-point group `orchestrator.runtimes`. Part of the protocol: a snapshot record names
the backend whose class removes its images. Which class runs a file, and starting it, are
the services' (`services/spawn.py`)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from orchestrator.sandbox.base import Runtime

ENTRY_POINT_GROUP = "orchestrator.runtimes"
_BUILTIN = {
    "local": "orchestrator.backends.local:LocalRuntime",
    "docker": "orchestrator.backends.docker.runtime:ComposeRuntime",
    "swarm": "orchestrator.backends.swarm.runtime:SwarmRuntime",
}
_registered: dict[str, type[Runtime]] = {}

R = TypeVar("R", bound="type[Runtime]")


def register_runtime(name: str) -> Callable[[R], R]:
    """Class decorator: make a Runtime subclass available as backend `name`. A class that
    already has a name of its own (registering an alias) keeps it: the alias is a subclass
    named `name`, so runtimes spawned through either name report the name they were asked by."""

    def deco(cls: R) -> R:
        _register(name, cls, f"register_runtime({name!r})")
        return cls

    return deco


def _register(name: str, cls: object, what: str) -> type[Runtime]:
    # Backend is the class half of Runtime (sandbox/backend.py), and Runtime its one subclass:
    # asked so, the registry needs not import sandbox/base.py, whose records import this (and
    # loads it only here: what lists environments by name loads no backend)
    from orchestrator.sandbox.backend import Backend

    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise UsageError(f"{what} is not a Runtime subclass")
    own = cls.__dict__.get("name")
    if not own:
        cls.name = name  # the class's own name (not one inherited), given by its registration
    elif own != name:
        module = cls.__module__
        cls = types.new_class(
            cls.__name__, (cls,), exec_body=lambda ns: ns.update(name=name, __module__=module)
        )
    _registered[name] = cast("type[Runtime]", cls)
    return _registered[name]


def _entry_points() -> dict[str, str]:
    """The plugin backends installed where this process imports from. Scanning every
    installed distribution's metadata costs about 20 ms, importlib.metadata's import
    included (a fifth of a whole `orchestrator ps`), so the answer is kept, in this process
    and in the state folder (CACHE), keyed by sys.path and each folder's mtime: a plugin
    folder added to the path, or a plugin installed into one or removed (its dist-info
    folder made or deleted), scans again."""
    return _scan(tuple((p, _mtime(p)) for p in sys.path))


CACHE = ("cache", "entry-points.json")
"""Below the state folder (private: only its owner may write it), the last scans, each with
its key: [{"key": [[folder, mtime], ...], "found": {name: target}}, ...], newest first."""
CACHE_LIMIT = 1 << 20
KEPT_SCANS = 8
"""Scans kept: one for each way of starting that alternates (`orchestrator`, `python -m`
from one folder or another: the first folder on the path differs)."""


def _mtime(path: str) -> int:
    try:
        return os.stat(path or ".").st_mtime_ns
    except OSError:
        return 0


@functools.lru_cache(maxsize=4)
def _scan(path: tuple[tuple[str, int], ...], fresh: bool = False) -> dict[str, str]:
    """The scan for sys.path `path` (with its folders' mtimes): the one kept, where each
    plugin's own entry-point file is as it was then too (one rewritten in place, as an
    egg-info's is, moves no folder), else a new one (`fresh`: always), kept."""
    key = [list(p) for p in path]
    scans = _kept()
    for scan in [] if fresh else scans:
        found, noted = scan.get("found"), scan.get("files")
        if scan.get("key") != key or not isinstance(found, dict) or not isinstance(noted, list):
            continue
        if all(isinstance(v, str) for v in found.values()) and _unchanged(noted):
            return {str(k): str(v) for k, v in found.items()}  # (JSON's keys are text)
    from importlib.metadata import entry_points

    made: dict[str, str] = {}
    files: set[tuple[str, int]] = set()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        made[ep.name] = ep.value
        folder = getattr(ep.dist, "_path", None)  # (a distribution's own metadata folder)
        if folder is not None:
            listed = os.path.join(str(folder), "entry_points.txt")
            files.add((listed, _mtime(listed)))
    newest: dict[str, object] = {"key": key, "found": made, "files": sorted(files)}
    _keep([newest, *(scan for scan in scans if scan.get("key") != key)][:KEPT_SCANS])
    return made


def _unchanged(files: list[object]) -> bool:
    """Whether each [file, mtime] a scan noted has that mtime still."""
    for noted in files:
        if not (isinstance(noted, list) and len(noted) == 2 and isinstance(noted[0], str)):
            return False
        if _mtime(noted[0]) != noted[1]:
            return False
    return True


def _kept() -> list[dict[str, object]]:
    """The scans kept in the state folder (none when they cannot be read, or the folder is
    not private to this user: what it names is imported)."""
    from orchestrator.errors import OrchestratorError
    from orchestrator.paths import read_regular, state_folder

    try:
        raw = read_regular(state_folder(CACHE[0]) / CACHE[1], CACHE_LIMIT)
    except (OSError, OrchestratorError):
        return []
    try:
        kept = json.loads(raw) if raw and len(raw) <= CACHE_LIMIT else []
    except ValueError:
        return []
    return [s for s in kept if isinstance(s, dict)] if isinstance(kept, list) else []


def _keep(scans: list[dict[str, object]]) -> None:
    """Keep `scans` for the next process (not kept where the state folder cannot be made)."""
    from orchestrator.errors import OrchestratorError
    from orchestrator.paths import state_folder, write_file

    with contextlib.suppress(OSError, OrchestratorError):
        write_file(state_folder(CACHE[0]) / CACHE[1], json.dumps(scans))


def runtime_names() -> list[str]:
    """Every backend that can be asked for by name."""
    return sorted({*_BUILTIN, *_registered, *_entry_points()})


def builtin(name: str) -> str | None:
    """The import path of built-in backend `name`; None for a plugin, and for a name
    registered in this process (by `register_runtime`, standing in for the built-in, or by
    loading the built-in itself: its class is then at hand)."""
    return None if name in _registered else _BUILTIN.get(name)


def get_runtime_class(name: str) -> type[Runtime]:
    if name in _registered:
        return _registered[name]
    # a plugin's import path comes from a scan of this process's own, never from the one
    # kept in the state folder, which someone else may have filled (a CI project's
    # ./.orch-state from a repository, a restored cache) with a module to import; the kept
    # scan only names the backends (`runtime_names`). One scan per process, ~20 ms.
    target = _BUILTIN.get(name)
    if target is None:
        target = _scan(tuple((p, _mtime(p)) for p in sys.path), fresh=True).get(name)
    if target is None:
        raise UsageError(f"unknown backend {name!r}; known backends: {', '.join(runtime_names())}")
    module, _, attr = target.partition(":")
    return _register(
        name, getattr(importlib.import_module(module), attr), f"backend {name!r} ({target})"
    )
