"""Which worker runs which tests (`pytest -n 8 --dist loadgroup`): the tests that share a
module's environment (a module-scoped fixture that makes an environment or a test world) go
whole to one worker, which makes it once; every other test goes where there is room.

xdist's own `loadgroup` reads the group from a suffix it appends to each test's id, which
the pytest this project runs on no longer lets it change (it groups nothing, silently). So
the groups are found here, on the workers (which collect the tests), written to the run's
folder, and read by a scheduler of ours on the controller (xdist's hook for one): the same
scopes as `loadgroup`, never a changed test id."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

GROUPS = "groups.json"
"""The groups' file, in the run's folder: {test id: group} for the tests that have one."""
CHEAP = frozenset({"conformance_target", "module_dir"})
"""Module-scoped fixtures that make nothing worth sharing (a target's description, a folder)."""


def shared_group(item: pytest.Item) -> str | None:
    """The group of a test that uses a module-scoped fixture that makes something: its module
    and the parameters of its module-scoped fixtures (the target it runs on), so one worker
    makes that environment once, not each worker that runs one of its tests (a services
    environment on the Swarm was made six times in one run; the run's time is what the
    engine spends making environments)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None

    def module_scoped(name: str) -> bool:
        defs = info.name2fixturedefs.get(name)
        return bool(defs) and defs[-1].scope == "module"

    if not any(module_scoped(n) and n not in CHEAP for n in getattr(item, "fixturenames", ())):
        return None
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec else {}
    picked = [str(getattr(params[n], "id", params[n])) for n in sorted(params) if module_scoped(n)]
    return "::".join([item.nodeid.split("::")[0], *picked])


def groups_of(items: list[pytest.Item]) -> dict[str, str]:
    """{test id: group} of the `items` that have one (shared_group)."""
    return {item.nodeid: g for item in items if (g := shared_group(item)) is not None}


def write(groups: dict[str, str], run_dir: Path) -> None:
    """Write the groups to the run's folder (each worker writes the same ones: the last
    rename wins, whole)."""
    part = run_dir / f"{GROUPS}.{os.getpid()}"
    part.write_text(json.dumps(groups))
    part.replace(run_dir / GROUPS)


class SharedScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduling, each scope a group of ours (else a test alone), handed out
    in the order the collection gives them (conftest orders them: the groups first, the
    Swarm's tests last), not largest first."""

    def __init__(self, config: pytest.Config, run_dir: Path, log: object = None) -> None:
        config.option.loadscopereorder = False
        super().__init__(config, log)
        self._file = run_dir / GROUPS
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:  # (first asked once every worker collected: written)
            try:
                self._groups = json.loads(self._file.read_text())
            except (OSError, ValueError):
                self._groups = {}  # none: each test its own scope, as `load` would
        return self._groups.get(nodeid, nodeid)
