"""Where one Compose service's keys are written (`service.Container` maps them; `storage`
maps those that bring files in): its v1 target (the file's top level for the main sandbox,
or a service), the line each v1 field came from, and the fate of each key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.spec.compose.model import ComposeMapping, Fate, Status
from orchestrator.spec.compose.variables import Loc


class Target:
    """One Compose service (`svc`, named `name`) and the v1 node it becomes (`out`, at
    `target`: the main sandbox's when `main`)."""

    def __init__(
        self,
        m: ComposeMapping,
        name: str,
        svc: dict[str, Any],
        target: Loc,
        main: bool,
        networks: dict[str, Any],
        base_dir: Path,
    ) -> None:
        self.m, self.name, self.svc, self.target, self.main = m, name, svc, target, main
        self.networks, self.base_dir = networks, base_dir
        self.src: Loc = ("services", name)
        node: dict[str, Any] = m.data
        for step in target:
            node = node.setdefault(str(step), {})
        self.out = node

    def fate(self, key: Loc, status: Status, why: str = "") -> None:
        """What became of Compose key `key` (under the service), and why."""
        self.m.fates.append(Fate((*self.src, *key), status, why))

    def put(self, v1: Loc, value: Any, key: Loc) -> None:
        """Set v1 field `v1` (under the target) from Compose key `key` (under the service)."""
        node = self.out
        for step in v1[:-1]:
            node = node.setdefault(str(step), {})
        node[str(v1[-1])] = value
        self.m.where[(*self.target, *v1)] = (*self.src, *key)

    def refuse(self, key: Loc, message: str, fix: str) -> None:
        """Compose key `key` (under the service) refused: why, and the fix."""
        self.m.refuse((*self.src, *key), message, fix)

    def simple(self, key: str, v1: Loc, value: Any) -> None:
        """Compose key `key` mapped as it is onto v1 field `v1`."""
        self.put(v1, value, (key,))
        self.fate((key,), "mapped")
