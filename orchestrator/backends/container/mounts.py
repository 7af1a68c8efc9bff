"""Mount merge rules.

Mounts merge by container path, lowest priority first: the workspace mount, then the file's
`mounts`, then mounts passed when spawning. Static assets are read-only at /static/<save_path>
and no other mount may shadow them. A mount target strictly inside `workdir` is an error
(it would hide part of the workspace). A relative source in the file resolves against the
file's own folder (`Environment.host_path`), one passed when spawning against the current
folder, never against the workspace (a private one is made afresh for each run).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.container.layout import IO_MOUNT, SANDBOX_MOUNT, STATIC_ROOT
from orchestrator.errors import SpecIssue
from orchestrator.spec.loader import Environment
from orchestrator.spec.models import Mount, VolumeMount
from orchestrator.spec.policy import UNREADABLE_FIX, look_up


@dataclass(frozen=True)
class ResolvedMount:
    source: Path
    target: str
    read_only: bool
    origin: str
    """Field path the mount came from, for error messages."""


def clean_path(path: str) -> str:
    """A container path as the engine reads it: Go's path.Clean, which takes `//a` for `/a`
    (Python's normpath keeps two leading slashes, and `//workspace/sub` passed for a path
    outside /workspace)."""
    return "/" + posixpath.normpath(path).lstrip("/")


def _inside(child: str, parent: str) -> bool:
    """True when `child` is strictly below `parent` (/workspace2 is not inside /workspace)."""
    parent = parent.rstrip("/") or "/"
    return child != parent and (child + "/").startswith(parent.rstrip("/") + "/")


def static_mounts(env: Environment) -> list[ResolvedMount]:
    return [
        ResolvedMount(
            look_up(Path(a.path), env.base_dir).real,
            f"{STATIC_ROOT}/{a.save_path}",
            True,
            f"static_assets.{i}",
        )
        for i, a in enumerate(env.spec.static_assets)
    ]


def service_workdir_issues(env: Environment) -> list[SpecIssue]:
    """A service's `workdir` is created and given to its user as root: never at or inside a
    mount (a host folder would change owner), the static assets or the orchestrator's own
    folder."""
    issues = []
    for name, svc in sorted(env.spec.services.items()):
        if svc.workdir is None:
            continue
        taken = [(f"services.{name}.mounts.{i}", m.target) for i, m in enumerate(svc.mounts)]
        taken += [
            ("static assets", STATIC_ROOT),
            ("the orchestrator's folder", SANDBOX_MOUNT),
            ("the orchestrator's transfer folder", IO_MOUNT),
        ]
        for what, target in taken:
            target = clean_path(target)
            if svc.workdir == target or _inside(svc.workdir, target):
                issues.append(
                    SpecIssue(
                        env.source,
                        field=f"services.{name}.workdir",
                        message=f"workdir {svc.workdir} is inside {target} ({what}), which "
                        "the service's user would be given",
                        fix="choose a workdir of the container's own, outside every mount",
                    )
                )
    return issues


RESERVED = (("the orchestrator's folder", SANDBOX_MOUNT), ("its transfer folder", IO_MOUNT))
"""Container paths of ours no mount may take, hide or sit inside."""


def volume_issues(
    env: Environment, where: str, volumes: Sequence[VolumeMount], taken: Sequence[ResolvedMount]
) -> list[SpecIssue]:
    """A container's named volumes (`where`: "" for the main sandbox, "services.NAME."):
    none on a folder of ours, and none where another mount of the container is."""
    as_mounts = [
        ResolvedMount(Path(v.volume), v.target, v.read_only, f"{where}volumes.{i}")
        for i, v in enumerate(volumes)
    ]
    issues = reserved_target_issues(env, as_mounts)
    seen = {posixpath.normpath(m.target): m.origin for m in taken}
    for m in as_mounts:
        target = posixpath.normpath(m.target)
        if target in seen:
            issues.append(
                SpecIssue(
                    file=env.source,
                    field=m.origin + ".target",
                    message=f"{target} is mounted already ({seen[target]})",
                    fix="give each mount a target of its own",
                )
            )
        seen[target] = m.origin
    return issues


def reserved_target_issues(env: Environment, mounts: list[ResolvedMount]) -> list[SpecIssue]:
    """A mount at, above or inside a folder the orchestrator mounts itself would hide the
    executor or another container's transfers: a spec error at the mount, before the engine
    refuses a duplicate target at start."""
    issues = []
    for m in mounts:
        target = posixpath.normpath(str(m.target))
        for what, ours in RESERVED:
            if target == ours or _inside(target, ours) or _inside(ours, target):
                field = "workdir" if m.origin == "workspace" else m.origin + ".target"
                issues.append(
                    SpecIssue(
                        file=env.source,
                        line=None,
                        column=None,
                        field=field,
                        message=f"{target} would take {ours} ({what})",
                        fix=f"choose a target outside {ours}",
                    )
                )
    return issues


def resolve_mounts(
    env: Environment, workspace: Path, extra: list[Mount]
) -> tuple[list[ResolvedMount], list[SpecIssue]]:
    """Merge every mount of the main sandbox; return them sorted by target, and the issues
    (the policy check of every source is the compiler's: `check_host_paths`)."""
    spec = env.spec
    issues: list[SpecIssue] = []
    merged: dict[str, ResolvedMount] = {}
    # the image's WORKDIR (workdir null) is known only once the sandbox runs; no workspace
    # is mounted there, and a mount inside it hides nothing of ours
    workdir = clean_path(spec.workdir) if spec.workdir is not None else None
    if spec.workspace.mount and workdir is not None:
        merged[workdir] = ResolvedMount(workspace, workdir, False, "workspace")
    layers = [("mounts", spec.mounts), ("spawn mounts", extra)]
    for origin, mounts in layers:
        for i, spec_mount in enumerate(mounts):
            target = clean_path(spec_mount.target)
            where = f"{origin}.{i}" if origin == "mounts" else f"{origin}[{i}]"
            if workdir is not None and _inside(target, workdir):
                issues.append(
                    SpecIssue(
                        env.source,
                        field=where + ".target",
                        message=f"mount target {target} is inside workdir {workdir}",
                        fix="put files inside the workspace instead, or mount outside the workdir",
                    )
                )
                continue
            # the file's: against its folder; the caller's: against the current folder
            found = (
                env.host_path(spec_mount.source)
                if origin == "mounts"
                else look_up(Path(spec_mount.source), Path.cwd(), home=True)
            )
            if found.error is not None:
                issues.append(
                    SpecIssue(
                        env.source,
                        field=where + ".source",
                        message=f"cannot look at mount source {spec_mount.source!r}: {found.error}",
                        fix=UNREADABLE_FIX,
                    )
                )
                continue
            merged[target] = ResolvedMount(found.real, target, spec_mount.read_only, where)
    statics = static_mounts(env)
    for s in statics:
        for m in merged.values():
            if m.target == s.target or _inside(s.target, m.target) or _inside(m.target, s.target):
                issues.append(
                    SpecIssue(
                        env.source,
                        field=m.origin,
                        message=f"mount at {m.target} would shadow static asset {s.target}",
                        fix="static assets are read-only and may not "
                        "be shadowed; choose another target",
                    )
                )
        found = look_up(s.source)
        if found.error is None and not found.exists:  # an error: check_host_paths says it
            issues.append(
                SpecIssue(
                    env.source,
                    field=s.origin + ".path",
                    message=f"asset path does not exist: {s.source}",
                    fix="",
                )
            )
    user_mounts = [m for m in merged.values() if m.origin != "workspace"]
    for m in user_mounts:
        if not look_up(m.source).exists:
            issues.append(
                SpecIssue(
                    env.source,
                    field=m.origin + ".source",
                    message=f"mount source does not exist: {m.source}",
                    fix="create it first, or fix the path (relative paths resolve "
                    "against the environment file's folder)",
                )
            )
    return sorted([*merged.values(), *statics], key=lambda m: m.target), issues
