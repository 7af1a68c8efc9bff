"""What of an invalid environment file is still worth checking: the file with every invalid
entry taken out, so that the later stages (asset paths, placeholders, the backend's and the
policy's checks) still run and one pass reports every problem the file has.

An entry the schema refuses is removed (a list item, a mapping key; a required top-level
field gets a stand-in), and the file validated again, a bounded number of times. Locations
in the pruned data map back to the file's (`Partial.original`), and a later stage's word
on a removed entry is dropped (`Partial.hides`): the schema's error says it already.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.spec.migrate import Loc

STAND_INS: dict[str, object] = {"version": 1, "name": "invalid-name"}
"""Required top-level fields: given these when missing or invalid, not removed."""
MAX_FIELD_PARTS = 64
"""A field path with more dots than this is not looked up in the file (a hostile key)."""


@dataclass
class Partial:
    """The valid part of a file, and how its locations map back to the file's."""

    data: Any
    kept: dict[Loc, list[int]] = field(default_factory=dict)
    """For each list (by its location in the file) with items removed: the file's indices
    of the items still there, in order."""
    removed: set[Loc] = field(default_factory=set)
    """Locations (in the file) of what was taken out."""
    above: set[Loc] = field(default_factory=set)
    """Every location holding something taken out (not the whole file)."""

    @classmethod
    def of(cls, data: Any) -> Partial:
        return cls(copy.deepcopy(data))

    def original(self, loc: Loc) -> Loc:
        """The file's location of `loc`, a location in the pruned data."""
        out: list[str | int] = []
        for step in loc:
            kept = self.kept.get(tuple(out))
            if isinstance(step, int) and kept is not None and 0 <= step < len(kept):
                step = kept[step]
            out.append(step)
        return tuple(out)

    def hides(self, loc: Loc) -> bool:
        """`loc` (the file's) is at, in or above something removed: a later stage's problem
        there follows from (or repeats) the schema's."""
        return loc in self.above or any(loc[:n] in self.removed for n in range(1, len(loc) + 1))

    def _remove(self, loc: Loc) -> None:
        self.removed.add(loc)
        self.above.update(loc[:n] for n in range(1, len(loc)))

    def prune(self, locs: Iterable[Loc]) -> bool:
        """Take out what each location (in the pruned data) names, or the deepest part of
        it there is; False when nothing could be taken out."""
        deletions: list[tuple[Any, str | int, Loc]] = []  # (container, key, file's list loc)
        changed = False
        seen: set[tuple[int, str | int]] = set()
        for loc in locs:
            target = _existing(self.data, loc)
            top = (target or loc)[:1]
            if len(target) <= 1 and top and top[0] in STAND_INS:
                if self.data.get(top[0]) != STAND_INS[str(top[0])]:
                    self.data[top[0]] = STAND_INS[str(top[0])]
                    changed = True
                continue
            if not target:
                continue  # the whole file: nothing to take out
            parent = _at(self.data, target[:-1])
            if (id(parent), target[-1]) in seen:
                continue  # two problems of one entry: it goes once
            seen.add((id(parent), target[-1]))
            self._remove(self.original(target))
            deletions.append((parent, target[-1], self.original(target[:-1])))
        for parent, key, _ in deletions:  # keys first: they shift no index
            if isinstance(parent, dict) and key in parent:
                del parent[key]
                changed = True
        items = [(p, k, where) for p, k, where in deletions if isinstance(p, list)]
        for parent, index, where in sorted(items, key=lambda d: -int(d[1])):
            if isinstance(index, int) and 0 <= index < len(parent):
                kept = self.kept.setdefault(where, list(range(len(parent))))
                if len(kept) != len(parent):
                    continue  # a list this round already changed under another name
                del parent[index]
                del kept[index]
                changed = True
        return changed


_MISSING = object()


def _child(node: Any, step: str | int) -> Any:
    """`node[step]` when `node` holds it, else _MISSING."""
    if isinstance(node, dict) and step in node:
        return node[step]
    if isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
        return node[step]
    return _MISSING


def _at(data: Any, loc: Loc) -> Any:
    node = data
    for step in loc:
        node = _child(node, step)
        if node is _MISSING:
            return None
    return node


def _existing(data: Any, loc: Loc) -> Loc:
    """The longest prefix of `loc` that names something in `data`."""
    node, out = data, []
    for step in loc:
        node = _child(node, step)
        if node is _MISSING:
            break
        out.append(step)
    return tuple(out)


def field_loc(data: Any, field_path: str) -> Loc:
    """The location a dotted field path ("services.db.mounts.0.source") names in `data` (a
    key holding dots, such as a service name, matched whole where it exists; what does not
    exist taken as written, numbers as list indices)."""
    parts = field_path.split(".") if field_path else []
    if len(parts) > MAX_FIELD_PARTS:
        return ()
    node, i = data, 0
    out: list[str | int] = []
    while i < len(parts):
        if isinstance(node, dict):
            j = next((j for j in range(len(parts), i, -1) if ".".join(parts[i:j]) in node), 0)
            if not j:
                break
            key = ".".join(parts[i:j])
            out.append(key)
            node, i = node[key], j
        elif isinstance(node, list) and parts[i].isdigit() and int(parts[i]) < len(node):
            out.append(int(parts[i]))
            node, i = node[int(parts[i])], i + 1
        else:
            break
    rest: list[str | int] = [int(p) if p.isdigit() else p for p in parts[i:]]
    return (*out, *rest)
