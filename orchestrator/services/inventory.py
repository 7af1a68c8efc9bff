"""Environments left running, across every backend: list them (`orchestrator ps`), remove
one by id (`down`), remove those whose owner process is gone (`cleanup`). Each backend
answers for its own through the class hooks `Runtime.running`, `running_ids`,
`remove_running` and `reap`; backends that share one implementation (the container ones
share one inventory) are asked once. A backend that cannot be imported, or whose engine
fails, is skipped with a warning in the log (the others' environments are still listed),
unless every backend that keeps environments failed: then its error is raised. A listing
that left out a backend whose engine failed for any reason but not being there
(BackendUnavailable), or that listed its own but for some (PartialListing: another engine
that did not answer), says so to a caller that asks (`environments(failures=...)`): `ps`
then exits 1, so that a partial list never passes for the whole one."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from orchestrator.errors import (
    BackendUnavailable,
    OrchestratorError,
    PartialListing,
    ProjectNotFound,
)
from orchestrator.sandbox import registry
from orchestrator.sandbox.keeping import Keeping, RunningLogs
from orchestrator.sandbox.record import match_id
from orchestrator.sandbox.results import EnvironmentStatus

T = TypeVar("T")
log = logging.getLogger("orchestrator.inventory")


KEEPERS = {
    "orchestrator.backends.docker.runtime:ComposeRuntime": "container.keeper:ContainerInventory",
    "orchestrator.backends.swarm.runtime:SwarmRuntime": "container.keeper:ContainerInventory",
    "orchestrator.backends.local:LocalRuntime": None,
}
"""What each built-in backend answers the hooks with (its class's own, held equal by a unit
test), under orchestrator.backends: asked so, a listing loads no backend. None: the base
class's defaults, keeping none."""


@dataclass(frozen=True)
class Keeper:
    """A backend that keeps environments: its name, and the class whose hooks answer."""

    name: str
    hooks: type[Keeping]


def _hooks(cls: type) -> tuple[object, ...]:
    return tuple(
        getattr(cls, name).__func__ for name in ("running", "running_ids", "remove_running", "reap")
    )


def _hooks_of(name: str) -> type[Keeping] | None:
    """The class whose hooks backend `name` answers with (None: it keeps none), loading a
    built-in backend's own module only where KEEPERS does not say."""
    target = registry.builtin(name)
    if target in KEEPERS:
        keeper = KEEPERS[target]
        if keeper is None:
            return None
        module, _, attr = keeper.partition(":")
        return cast(
            "type[Keeping]",
            getattr(importlib.import_module(f"orchestrator.backends.{module}"), attr),
        )
    return registry.get_runtime_class(name)


def _backends() -> list[Keeper]:
    """One for each distinct implementation of the hooks that keeps environments (the base
    class's defaults keep none), in registry order."""
    seen = {_hooks(Keeping)}
    out = []
    for name in registry.runtime_names():
        try:
            cls = _hooks_of(name)
        except (ImportError, OrchestratorError) as exc:
            log.warning("backend %r skipped: %s", name, exc)
            continue
        if cls is not None and _hooks(cls) not in seen:
            seen.add(_hooks(cls))
            out.append(Keeper(name, cls))
    return out


def _each(
    ask: Callable[[type[Keeping]], T], failures: list[str] | None = None
) -> list[tuple[Keeper, T]]:
    """`ask` of every backend; one that fails is left out (logged, and but for one that
    cannot run here, added to `failures`) unless all fail."""
    answers, failed = [], []
    backends = _backends()
    for cls in backends:
        try:
            answers.append((cls, ask(cls.hooks)))
        except PartialListing as exc:  # what it listed stands; what it could not, is said
            answers.append((cls, cast(T, exc.partial)))
            if failures is not None:
                failures.append(f"the {cls.name} backend's environments are not all listed: {exc}")
            log.warning("backend %r listed in part: %s", cls.name, exc)
        except OrchestratorError as exc:
            if failures is not None and not isinstance(exc, BackendUnavailable):
                failures.append(f"the {cls.name} backend's environments are not listed: {exc}")
            log.warning("backend %r skipped: %s", cls.name, exc)
            failed.append(exc)
    if failed and len(failed) == len(backends):
        raise failed[0]
    return answers


def environments(
    *, usage: bool = False, failures: list[str] | None = None
) -> tuple[list[EnvironmentStatus], list[str]]:
    """Every environment left running, by id; second, the ids of those just removed because
    their owner process is gone. With `usage`, what each cost so far (its `usage`: one
    reading of its sandboxes' accounting, from outside its owner). A backend whose engine
    failed is left out, the others listed; `failures` gets a line for each such one."""
    rows: list[EnvironmentStatus] = []
    removed: list[str] = []

    def ask(cls: type[Keeping]) -> tuple[list[EnvironmentStatus], list[str]]:
        # (asked without `usage` when not wanted: a backend written before it takes none)
        return cls.running(usage=True) if usage else cls.running()

    for _, (found, gone) in _each(ask, failures):
        rows += found
        removed += gone
    return sorted(rows, key=lambda r: r.id), removed


def running_logs(
    ident: str, service: str | None = None, *, tail: int | None = None, follow: bool = False
) -> RunningLogs | None:
    """The logs of environment `ident` (its whole id) read from outside its owner without
    attaching to it, where its backend can (see Keeping.running_logs): the services they
    come from, in the order `orchestrator logs` prints them, and each one's log as it comes.
    None where none can (a backend that failed included): `attach(ident).logs(...)` then
    reads them, or says why it cannot."""
    for keeper in _backends():
        try:
            found = keeper.hooks.running_logs(ident, service, tail=tail, follow=follow)
        except OrchestratorError as exc:
            log.debug("backend %r cannot read logs without attaching: %s", keeper.name, exc)
            continue
        if found is not None:
            return found
    return None


def remove_environment(ref: str, *, force: bool = False, exact: bool = False) -> str:
    """Remove the environment `ref` names (its id, short id, environment name or a unique
    prefix, over every backend's environments at once; with `exact`, its whole id only) and
    return its id. ProjectNotFound when it names none or several; UsageError when its owner
    process still uses it, unless `force`."""
    owner = {ident: cls for cls, ids in _each(lambda cls: cls.running_ids()) for ident in ids}
    if exact and ref not in owner:
        raise ProjectNotFound(f"{ref} is gone already; `orchestrator ps` lists what runs")
    name = match_id(ref, sorted(owner))
    if owner[name].hooks.remove_running(name, force=force) is None:
        raise ProjectNotFound(f"{name} is gone already; `orchestrator ps` lists what runs")
    return name


def reap(*, everything: bool = False, include_kept: bool = False) -> list[str]:
    """Remove what is left of environments whose owner process is gone (every one of ours
    with `everything`; those kept on purpose only with `include_kept`): what was removed,
    one line each."""
    from orchestrator.sandbox import hostpack
    from orchestrator.sandbox.snapshot import snapshots_dir

    done = _each(lambda cls: cls.reap(everything=everything, include_kept=include_kept))
    parts = hostpack.sweep_parts(snapshots_dir())  # snapshots their writer never finished
    return [line for _, lines in done for line in lines] + parts
