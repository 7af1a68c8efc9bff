"""How each container of a Compose project gets the host folders and files it mounts, once
the policy has passed them: pinned (backends/container/binds.py), and with the seccomp
profile that keeps set-user-ID programs out of the folders it writes
(backends/container/seccomp.py).

Per container:
- a host folder or file the file or the caller names (mounts, static assets, the caller's
  workspace) is pinned at start: a folder as a `local` volume bound to the descriptor this
  process holds, a file as a private link or copy; `render` and `validate` show the path;
- the private workspace and the project's own folders are plain binds: they lie in the
  owner-only project folder, which no file may name and no sandbox can reach;
- a container that can write a host folder other than the private workspace gets the
  profile without set-user-ID and set-group-ID bits (SECCOMP_FILE); under gVisor, which
  does not apply it to `docker exec`'d processes, each such folder must have a folder above it
  that no other host user can pass (`closed_to_others`), or the file is refused."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.backends.container.binds import (
    PIN_VOLUME,
    SOURCE_LABEL,
    Pinned,
    PinRefused,
    Pins,
    closed_to_others,
    engine_shares_ns,
    linked_elsewhere,
)
from orchestrator.backends.container.engine import Engine
from orchestrator.backends.container.mounts import ResolvedMount
from orchestrator.errors import SpecIssue
from orchestrator.spec.loader import Environment
from orchestrator.spec.policy import UNPINNED_ENV

if TYPE_CHECKING:
    from orchestrator.backends.docker.render import CompileOptions

SECCOMP_FILE = "seccomp.json"
"""In the project folder: the profile of containers that write a shared host folder."""
UNGUARDED_BY = frozenset({"MKNOD", "SETFCAP", "FSETID"})
"""Capabilities (the caller's to grant) with which a sandbox can leave a device, a program
with file capabilities or a rewritten set-user-ID one in a folder it writes."""
CANNOT_PIN = (
    "this engine cannot mount a folder this process holds open (it is not on this "
    "machine's socket in this process's namespaces: a rootless engine, an engine in a VM, "
    "or this process in a container), so the path would be resolved again by the engine, "
    "and a sandbox that can write near it could swap it for a link first"
)
PODMAN_CANNOT_PIN = (
    "Podman fills a volume from the image and gives its folder the owner and mode of the "
    "image's folder the first time it mounts it (it ignores nocopy), and a pinned folder's "
    "volume is the host folder itself; so a host path is given to it by path, and a sandbox "
    "that can write near it could swap it for a link first"
)
UNPINNED_WARNING = (
    f"WARNING: host mounts are given to the engine by path ({UNPINNED_ENV}=1): a sandbox "
    "that can write near one could swap it for a link between the check and the mount"
)


@functools.cache
def _shares_ns(sock: str | None) -> bool:
    return engine_shares_ns(sock)


def pin_options(made: CompileOptions, pins: Pins, host: str) -> CompileOptions:
    """A start's compile options with its pins, or why it cannot pin: on a remote engine
    nothing of this machine is mounted; where the engine cannot resolve our descriptors,
    paths only when the caller accepted them (Policy.allow_unpinned_mounts)."""
    if made.remote:
        return made
    engine = Engine.at(host)
    why = "" if _shares_ns(engine.socket) else CANNOT_PIN
    if not why and engine.kind == "podman":
        why = PODMAN_CANNOT_PIN
    if not why:
        return dataclasses.replace(made, pins=pins)
    if made.policy.allow_unpinned_mounts:
        return dataclasses.replace(made, unpinned_warning=UNPINNED_WARNING)
    return dataclasses.replace(made, pin_refused=why)


@dataclass
class Binding:
    """The mounts of every container of one project, as the template renders them."""

    env: Environment
    pins: Pins | None
    """None: sources rendered as paths (`render`, `validate`, or a start whose caller
    accepted unpinned mounts)."""
    refused: str = ""
    """Why a start cannot pin (this engine cannot resolve our descriptors): each host mount
    is then a problem, unless the caller accepted paths (then `pins` is None and this "")."""
    private: Path | None = None
    """The private workspace (a plain bind), when the workspace is one."""
    warning: str = ""
    """Said once when a host mount is given by path at a start (the caller accepted it)."""
    warnings: list[str] = field(default_factory=list)
    volumes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The pinned folders' volumes: name -> {device, source}."""
    writable: list[Path] = field(default_factory=list)
    """Every host folder (or file) a container writes, the private workspace included."""
    after: list[Path] = field(default_factory=list)
    """Host folders a container writes where nothing stopped it making set-id programs,
    file capabilities or devices (gVisor, or a capability the caller granted): defused
    after the run (hostfs.defuse), besides the workspace."""
    issues: list[SpecIssue] = field(default_factory=list)
    _named: dict[str, str] = field(default_factory=dict)

    def container(
        self, mounts: list[ResolvedMount], *, gvisor: bool, caps: list[str]
    ) -> tuple[list[dict[str, Any]], bool]:
        """The template's mounts of one container, and whether it needs the profile."""
        out, shared_write = [], False
        unguarded = gvisor or bool(UNGUARDED_BY & set(caps))
        for m in mounts:
            mine = m.origin == "workspace" and self.private is not None
            if not m.read_only and m.source not in self.writable:
                self.writable.append(m.source)
            if not m.read_only and not mine:
                shared_write = True
                if gvisor:
                    self._closed(m)
                if unguarded and m.source not in self.after:
                    self.after.append(m.source)
            out.append(self._render(m, plain=mine))
        return out, shared_write and not gvisor

    def _render(self, m: ResolvedMount, *, plain: bool) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "type": "bind",
            "source": str(m.source),
            "target": m.target,
            "read_only": m.read_only,
        }
        if plain or (self.pins is None and not self.refused):
            if not plain and self.warning and self.warning not in self.warnings:
                self.warnings.append(self.warning)
            return entry
        if self.refused:
            self._problem(
                m,
                self.refused,
                "run it on an engine in this process's namespaces (root's own engine on this "
                f"machine), or let the caller accept the race: {UNPINNED_ENV}=1",
            )
            return entry
        assert self.pins is not None
        try:
            pinned = self.pins.pin(m.source, writable=not m.read_only)
        except (PinRefused, OSError) as exc:
            self._problem(
                m,
                f"{m.source} cannot be mounted as it was checked: {exc}",
                "if a sandbox can write the folder that holds it, mount it from a folder no "
                "sandbox writes",
            )
            return entry
        if not pinned.folder:
            return {**entry, "source": pinned.device}
        return {**entry, "type": "volume", "source": self._volume(pinned)}

    def _volume(self, pinned: Pinned) -> str:
        name = self._named.get(pinned.device)
        if name is None:
            name = self._named[pinned.device] = f"{PIN_VOLUME}{len(self._named)}"
            self.volumes[name] = {"device": pinned.device, "source": str(pinned.source)}
        return name

    def _closed(self, m: ResolvedMount) -> None:
        """Under gVisor a sandbox may set set-id bits on what it writes: nothing it writes
        may be reachable by another host user, through a folder above or another link."""
        fix = (
            f"make a folder above it private (chmod 700 {m.source.parent}), mount it "
            "read_only, or use the private workspace"
        )
        if closed_to_others(m.source) is None:
            self._problem(
                m,
                f"under gVisor a root sandbox can leave set-user-ID programs in {m.source}, "
                "and other users of this host can reach it (no folder above it is closed "
                "to them)",
                fix,
            )
        elif (why := linked_elsewhere(m.source)) is not None:
            self._problem(
                m,
                f"under gVisor a root sandbox can make a file it writes set-user-ID, and {why}"
                ": another link may be where other users of this host reach it",
                "give it a folder whose files have one link each, " + fix.partition(", ")[2],
            )

    def _problem(self, m: ResolvedMount, message: str, fix: str) -> None:
        if m.origin == "workspace":
            field_ = "workspace"
        elif m.origin.startswith("static_assets"):
            field_ = m.origin + ".path"
        else:
            field_ = m.origin + ".source"
        issue = SpecIssue(self.env.source, field=field_, message=message, fix=fix)
        if issue not in self.issues:
            self.issues.append(issue)


def volume_labels(labels: Mapping[str, str], source: str) -> dict[str, str]:
    """A pinned folder's volume: the project's labels, and the path it stands for."""
    return dict(sorted({**labels, SOURCE_LABEL: source}.items()))
